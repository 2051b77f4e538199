"""The `mpi` backend: one MPI rank per worker (`popxl-run --backend mpi --workers W` is
`mpiexec -n W`).

Rank 0 runs the user's script (the host) and serves the first block of replicas itself; the other
ranks serve commands in `serve()` for every Session the script creates. Commands and replies are
pickled messages on one communicator; collectives exchange raw bytes point-to-point on another.
Nobody spins while idle or waiting: every wait polls with `Iprobe`/`Test` and sleeps, checks that
the other processes are alive, and honours aborts, so a failed or dead worker becomes an exception
in the host script instead of a hang.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...engine.comm import Transport
from ...errors import (
    CollectiveTimeout,
    EngineError,
    HostUnreachable,
    RunAborted,
    WorkerDied,
    WorkerError,
)
from ..env import collective_timeout, peer_timeout, worker_count
from ..process.liveness import LAUNCHER_ENV, ProcessRef, Watchdog, exit_process
from ..process.mpi_segments import unlink_mpich_segments
from ..process.polling import Backoff as _Backoff
from ..process.polling import process_alive as _alive
from ..process.polling import process_stopped
from ..transport.mpi_heartbeat import MPIHeartbeat
from ..transport.reachability import host_unreachable
from ..transport.reported import (
    flight_of,
    host_error,
    message_of,
    reported,
    with_flights,
)
from .pool import WorkerPool
from .service import WorkerService

__all__ = ["MPIPool", "mpi_pool", "launched_by_popxl_run", "spanning_heartbeat",
           "returning_errors", "broken_peers"]

CMD, REPLY, ABORT = 11, 12, 13
_LIVENESS_PERIOD = 0.5
_ABORT_GRACE = 5.0
_DIVERGE_GRACE = 1.0
_SILENT_GRACE = 1.0     # seconds a worker silent in a collective gets to answer an abort


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def broken_peers(requests: Dict[int, list]) -> List[int]:
    """The peers (of `requests`: peer -> its requests) whose requests MPI fails: their
    connection broke (the process died: see popxl_launch.mpiexec.across_hosts_env)."""
    from mpi4py import MPI

    broken = []
    for peer, reqs in requests.items():
        for r in reqs:
            try:
                r.Test()
            except MPI.Exception:
                broken.append(peer)
                break
    return broken


class MPITransport(Transport):
    """Collective exchanges as byte messages on the pool's data communicator."""

    def __init__(self, pool: "MPIPool"):
        self.pool = pool
        self.run_id = 0
        self._buffers: Dict[tuple, np.ndarray] = {}

    def _buffer(self, peer: int, n: int, dtype) -> np.ndarray:
        """A receive buffer, reused across collectives (the communicator consumes what it
        receives before the next exchange)."""
        key = (peer, n, np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) > 64:
                self._buffers.clear()
            buf = self._buffers[key] = np.empty(n, dtype)
        return buf

    def exchange(self, sends, recvs, tag):
        from mpi4py import MPI

        pool = self.pool
        mtag = ((self.run_id % 8192) << 15) | tag
        bufs = {p: self._buffer(p, n, dtype) for p, (n, dtype) in recvs.items()}
        rreqs: list = []
        by_peer: Dict[int, list] = {}
        try:
            for p in bufs:
                rreqs.append(pool.data.Irecv([bufs[p].view(np.uint8), MPI.BYTE], source=p,
                                             tag=mtag))
                by_peer.setdefault(p, []).append(rreqs[-1])
            keep = [np.ascontiguousarray(a) for a in sends.values()]
            sreqs = []
            for p, a in zip(sends, keep):
                sreqs.append(pool.data.Isend([a.view(np.uint8), MPI.BYTE], dest=p, tag=mtag))
                by_peer.setdefault(p, []).append(sreqs[-1])
        except MPI.Exception as e:
            raise pool.connection_lost(broken_peers(by_peer) or list(bufs) or list(sends),
                                       e) from None
        reqs = rreqs + sreqs
        deadline = time.monotonic() + pool.timeout
        backoff = _Backoff()
        finished_at = None
        try:
            while not MPI.Request.Testall(reqs):
                if pool.check_during_collective(self.run_id, list(bufs)) and finished_at is None:
                    finished_at = time.monotonic()
                if finished_at is not None and time.monotonic() - finished_at > _DIVERGE_GRACE:
                    # Its data may still be in flight when its reply arrives (another
                    # communicator, no ordering), hence the grace period.
                    raise WorkerError(f"worker {pool.rank}: a peer among workers {sorted(bufs)} "
                                      f"finished the run without joining this collective (tag "
                                      f"{tag}): the replicas diverged")
                if time.monotonic() > deadline:
                    silent = [p for p, r in zip(bufs, rreqs) if not r.Test()]
                    err = CollectiveTimeout(
                        f"worker {pool.rank}: collective (tag {tag}) got no data from worker(s) "
                        f"{silent} within {pool.timeout:g} s (POPXL_COLLECTIVE_TIMEOUT)")
                    err.workers, err.timeout = tuple(silent), pool.timeout
                    raise err
                backoff.wait()
        except BaseException as e:
            for r in rreqs:
                try:
                    r.Cancel()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            if isinstance(e, MPI.Exception):
                raise pool.connection_lost(broken_peers(by_peer) or list(by_peer), e) from None
            raise
        return bufs


class MPIPool(WorkerPool):
    """Every rank of MPI.COMM_WORLD is a worker; rank 0 is also the host."""

    name = "mpi"

    def __init__(self):
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.ctrl = returning_errors(world.Dup())
        self.data = returning_errors(world.Dup())
        self.timeout = collective_timeout()
        self.procs = self.ctrl.allgather((socket.gethostname(), os.getpid()))
        # Every rank has attached MPICH's shared memory by now (MPI_Init is done everywhere):
        # unlinked, it goes with the last process however the job ends.
        unlink_mpich_segments()
        # Across hosts, heartbeats tell a host that stopped answering (transport/mpi_heartbeat.py).
        self.beat = spanning_heartbeat(world, self.procs)
        self._peer_signal_at = 0.0
        self._last_stop_check = 0.0
        self.transport = MPITransport(self)
        self.service = WorkerService(self.rank, self.transport, self._on_run)
        self.broken: Optional[str] = None
        self.reported = False                    # the script was given the pool's failure
        self.interrupted = False                 # a run was stopped by Ctrl-C
        self._replies: Dict[int, tuple] = {}     # worker -> reply of the current call
        self._abort_sends: list = []             # aborts sent to silent workers, in flight
        self._last_liveness = time.monotonic()
        self._peer_signal = False
        if threading.current_thread() is threading.main_thread():
            # mpiexec -disable-auto-cleanup signals SIGUSR1 when a rank dies (default: terminate).
            signal.signal(signal.SIGUSR1, self._on_peer_failure)
        self._launcher = ProcessRef.parse(os.environ.get(LAUNCHER_ENV, ""))
        self.watchdog: Optional[Watchdog] = None
        if self.size > 1 or self._launcher is not None:
            self.watchdog = Watchdog(self._watch, name="popxl-mpi-watchdog")

    def _on_peer_failure(self, signum, frame) -> None:
        self._peer_signal = True
        self._peer_signal_at = self._peer_signal_at or time.monotonic()

    def _on_run(self, run_id: int) -> None:
        self.transport.run_id = run_id

    # --- liveness ------------------------------------------------------------------------
    def _watch(self) -> Optional[BaseException]:
        """The watchdog's check (see `liveness`): every rank ends when the launcher died, a
        worker when the host died; the host gets WorkerDied (raised while it computes its own
        replicas) when a worker died."""
        if self._launcher is not None and self._launcher.gone():
            exit_process(f"MPI rank {self.rank}: the launcher (popxl-run, pid "
                         f"{self._launcher.pid}) died")
        if self.rank != 0:
            if self._dead_peers([0]):
                exit_process(f"MPI rank {self.rank}: the host (MPI rank 0, pid "
                             f"{self.procs[0][1]}) died")
            self._exit_if_host_unreachable()
            return None
        if self.closed:
            return None
        dead = self._dead_peers(range(1, self.size))
        if dead:
            return self._died(dead)
        if self.beat is not None and self.beat.failed:
            return self._died(sorted(self.beat.failed), "its connection broke")
        silent = self.beat.silent(range(1, self.size)) if self.beat else []
        return self._unreachable(silent) if silent else None

    def connection_lost(self, ranks: Sequence[int], exc: BaseException) -> WorkerDied:
        """WorkerDied for `ranks`, whose connection MPI reports broken (`exc`)."""
        if self.beat is not None:
            self.beat.failed.update(ranks)
        return self._died(sorted(ranks), f"MPI: {str(exc).splitlines()[0]}")

    def _exit_if_host_unreachable(self) -> None:
        """A worker whose host (rank 0) went silent (or whose connection to it broke) ends:
        nobody can stop it any more."""
        if self.beat is not None and 0 in self.beat.failed:
            exit_process(f"MPI rank {self.rank}: the host (MPI rank 0, pid {self.procs[0][1]} "
                         f"on {self.procs[0][0]}) died")
        if self.beat is not None and self.beat.silent([0]):
            exit_process(f"MPI rank {self.rank}: the host (MPI rank 0, pid {self.procs[0][1]} "
                         f"on {self.procs[0][0]}) is unreachable: no heartbeat for "
                         f"{self.beat.timeout:g} s (POPXL_PEER_TIMEOUT)")

    def _unreachable(self, ranks: Sequence[int]):
        """Mark the pool unusable; HostUnreachable naming the silent ranks' hosts and every
        rank on them."""
        hosts = {self.procs[r][0]: "" for r in ranks}
        members = {r: (h, f"MPI rank {r}, pid {pid}") for r, (h, pid) in enumerate(self.procs)
                   if r != self.rank}
        err = host_unreachable(hosts, members, self.beat.timeout, heartbeats=True,
                               suffix="; the MPI worker pool cannot be used again")
        self.broken = str(err)
        self.reported = True
        return err

    def _died(self, dead: Sequence[int], why: str = "") -> WorkerDied:
        """Mark the pool unusable; the error that names the dead workers (and their hosts)."""
        self.broken = f"MPI rank(s) {list(dead)} died"
        self.reported = True
        hosts = sorted({self.procs[r][0] for r in dead})
        err = WorkerDied(f"worker(s) {list(dead)} (MPI rank(s) {list(dead)} on "
                         f"{', '.join(hosts)}) died{' (' + why + ')' if why else ''}; the MPI "
                         f"worker pool cannot be used again")
        err.workers = list(dead)
        return err

    def _stopped(self, ranks: Sequence[int]) -> bool:
        """Whether every one of `ranks` is a stopped process on this host (it cannot answer)."""
        host = socket.gethostname()
        return all(self.procs[r][0] == host and process_stopped(self.procs[r][1]) for r in ranks)

    def _dead_peers(self, ranks: Sequence[int]) -> List[int]:
        host = socket.gethostname()
        return [r for r in ranks if self.procs[r][0] == host and not _alive(self.procs[r][1])]

    def _check_liveness(self, ranks: Sequence[int], force: bool = False) -> None:
        now = time.monotonic()
        since = now - self._last_liveness
        if since < _LIVENESS_PERIOD and not self._peer_signal and not (force and since > 0.01):
            return
        self._last_liveness = now
        dead = self._dead_peers(ranks)
        remote = [r for r in ranks if self.procs[r][0] != socket.gethostname()]
        if not dead and self._peer_signal and remote:
            if self.beat is None:
                dead = remote
            elif now - self._peer_signal_at > 2 * self.beat.period + 0.1:
                # The process manager says a rank ended: those that stopped beating then.
                dead = self.beat.quiet_since(self._peer_signal_at, remote)
        if dead:
            raise self._died(dead)
        failed = sorted(self.beat.failed.intersection(ranks)) if self.beat is not None else []
        if failed:
            raise self._died(failed, "its connection broke")
        silent = self.beat.silent(ranks) if self.beat is not None else []
        if silent:
            raise self._unreachable(silent)

    # --- host side ---------------------------------------------------------------------
    def call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        if self.rank != 0:
            raise RuntimeError("only MPI rank 0 (the host) drives sessions")
        if self.broken:
            raise WorkerDied(f"the MPI worker pool is unusable: {self.broken}")
        run_id = next(self._runs)
        n = len(payloads)
        # Never message a dead rank: MPICH may take the whole job down with it.
        self._check_liveness(range(1, n), force=True)
        self._replies = {}
        sends = [self.ctrl.isend((cmd, sid, run_id, payloads[w]), dest=w, tag=CMD)
                 for w in range(1, n)]
        try:
            with self._armed():       # this thread does not poll while it computes
                own = self.service.handle(cmd, sid, run_id, payloads[0])
            self._wait_replies(run_id, range(1, n))
        except BaseException as e:
            # Not waiting for the command sends: a large one to a dead rank never completes.
            self._abort(run_id, range(1, n), e)
            with_flights(e, self._peer_flights(run_id))
            raise
        for s in sends:
            s.wait()            # every worker replied, so it has received its command
        results = [own]
        for w in range(1, n):
            status, _, _, value = self._replies[w]
            results.append(value)
        return results

    def _peer_flights(self, run_id: int) -> list:
        """The flight records the other workers sent with their failure or abort replies."""
        out = []
        for status, _, rid, value in self._replies.values():
            if rid == run_id and status in ("aborted", "timeout", "error"):
                out.append(value[-1])
        return out

    def _armed(self):
        return self.watchdog.armed() if self.watchdog is not None else contextlib.nullcontext()

    def _take_reply(self, run_id: int) -> Optional[int]:
        """Receive one pending reply if there is one; raise if it reports a failure."""
        from mpi4py import MPI

        st = MPI.Status()
        if not self.ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=st):
            return None
        reply = self.ctrl.recv(source=st.Get_source(), tag=REPLY)
        status, worker, rid, value = reply
        if rid != run_id:
            return None                          # a late reply of an aborted run
        self._replies[worker] = reply
        if status == "error":
            report, flight = value
            raise with_flights(host_error(report, lambda text: WorkerError(
                f"worker {worker} (MPI rank {worker}) failed: {text}")), [flight])
        if status == "timeout":
            text, silent, flight = value
            err = CollectiveTimeout(f"worker {worker} (MPI rank {worker}): {text}")
            err.workers = tuple(silent)
            raise with_flights(err, [flight])
        if status == "died":
            _, dead, unreachable = value
            if unreachable and self.beat is not None:
                raise self._unreachable(list(dead))
            raise self._died(sorted(set(dead) | set(self._dead_peers(
                [r for r in range(1, self.size) if r != worker]))) or [worker])
        return worker

    def _wait_replies(self, run_id: int, workers: Sequence[int]) -> None:
        """Wait for the workers' replies. A worker of this host stopped (SIGSTOP) for
        POPXL_COLLECTIVE_TIMEOUT seconds meanwhile fails the run with CollectiveTimeout, as in
        a collective (on another host, its heartbeats stop: HostUnreachable)."""
        backoff = _Backoff()
        stopped: Dict[int, float] = {}
        while any(w not in self._replies for w in workers):
            if self._take_reply(run_id) is None:
                pending = [w for w in workers if w not in self._replies]
                self._check_liveness(pending)
                self._check_stopped(pending, stopped)
                backoff.wait()
            else:
                backoff = _Backoff()

    def _check_stopped(self, pending: Sequence[int], stopped: Dict[int, float]) -> None:
        """Raise CollectiveTimeout for workers of this host stopped for the whole timeout
        (`stopped`: worker -> when it was first seen stopped)."""
        now = time.monotonic()
        if now - self._last_stop_check < _LIVENESS_PERIOD:
            return
        self._last_stop_check = now
        host = socket.gethostname()
        for w in pending:
            if self.procs[w][0] == host and process_stopped(self.procs[w][1]):
                stopped.setdefault(w, now)
            else:
                stopped.pop(w, None)
        late = sorted(w for w, t in stopped.items() if now - t > self.timeout)
        if late:
            err = CollectiveTimeout(f"worker(s) {late} (MPI rank(s) {late}) stopped for "
                                    f"{self.timeout:g} s while the host waited for their reply "
                                    f"(POPXL_COLLECTIVE_TIMEOUT)")
            err.workers, err.timeout = tuple(late), self.timeout
            raise err

    def check_during_collective(self, run_id: int, peers: Sequence[int]) -> bool:
        """Called while this rank waits in a collective: raise if the run failed elsewhere;
        True if a peer it waits for has finished the run (the host knows)."""
        from mpi4py import MPI

        if self.rank == 0:
            self._take_reply(run_id)
            self._check_liveness(peers)
            return any(w in self._replies for w in peers)
        else:
            st = MPI.Status()
            while self.ctrl.Iprobe(source=0, tag=ABORT, status=st):
                rid, reason = self.ctrl.recv(source=0, tag=ABORT)
                if rid == run_id:
                    raise RunAborted(reason)
            self._check_liveness([0] + list(peers))
        return False

    def _abort(self, run_id: int, workers: Sequence[int], exc: BaseException) -> None:
        """Stop the other workers' part of a failed run and collect their replies."""
        if isinstance(exc, WorkerDied):
            return
        if not isinstance(exc, Exception):
            # Interrupted (Ctrl-C): the script is on its way out, so no waiting for the others
            # (they are stopped when it ends).
            self.broken = self.broken or f"a run was interrupted ({_describe(exc)})"
            self.interrupted = True
            return
        # A dead worker cannot answer: never wait for it (nor message it).
        pending = [w for w in workers if w not in self._replies
                   and w not in self._dead_peers([w])]
        silent = [w for w in getattr(exc, "workers", ()) if w in pending] \
            if isinstance(exc, CollectiveTimeout) else []
        for w in pending:
            message = (run_id, f"another worker failed: {_describe(exc)}")
            if w in silent:     # never block on a worker that may not take it (kept until done)
                self._abort_sends.append(self.ctrl.isend(message, dest=w, tag=ABORT))
            else:
                self.ctrl.send(message, dest=w, tag=ABORT)
        start = time.monotonic()
        backoff = _Backoff()
        while any(w not in self._replies for w in pending):
            try:
                if self._take_reply(run_id) is None:
                    backoff.wait()
            except EngineError:          # their failures (the first one is being raised)
                pass
            waited = time.monotonic() - start
            quiet = [w for w in silent if w not in self._replies]
            if quiet and (waited > _SILENT_GRACE or self._stopped(quiet)):
                # They sent nothing for the whole timeout and do not answer now (stopped or
                # hung): waiting longer would only delay the error, and they cannot take
                # new commands. (One waiting in another collective answers the abort at once,
                # with its flight records.)
                self.broken = (f"worker(s) {quiet} sent nothing to a collective within "
                               f"{self.timeout:g} s (stopped or hung?)")
                return
            if waited > _ABORT_GRACE:
                stuck = [w for w in pending if w not in self._replies]
                self.broken = f"worker(s) {stuck} did not stop after a failure"
                return

    def shutdown(self) -> bool:
        """Tell the workers to exit; False if some cannot be reached (the caller aborts MPI)."""
        if self.rank != 0 or self.size == 1:
            return True
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.broken:
            return False
        self.closed = True
        for w in range(1, self.size):
            self.ctrl.send(("shutdown", 0, 0, None), dest=w, tag=CMD)
        # Wait for every worker's goodbye: one that cannot answer would hang MPI_Finalize.
        from mpi4py import MPI

        waiting = set(range(1, self.size))
        deadline = time.monotonic() + _ABORT_GRACE
        backoff = _Backoff()
        st = MPI.Status()
        while waiting:
            if self.ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=st):
                reply = self.ctrl.recv(source=st.Get_source(), tag=REPLY)
                if reply[0] == "bye":
                    waiting.discard(reply[1])
                continue
            if time.monotonic() > deadline or self._dead_peers(sorted(waiting)):
                self.broken = f"worker(s) {sorted(waiting)} did not acknowledge the shutdown"
                return False
            backoff.wait()
        return self.beat is None or self.beat.close()

    def kill_workers(self) -> None:
        """SIGKILL the workers on this host (the host's way out of a broken pool: a stopped or
        stuck worker can neither finish nor let MPI finalise)."""
        host = socket.gethostname()
        for r in range(1, self.size):
            if self.procs[r][0] == host and _alive(self.procs[r][1]):
                try:
                    os.kill(self.procs[r][1], signal.SIGKILL)
                except OSError:
                    pass

    # --- worker side -------------------------------------------------------------------
    def serve(self) -> None:
        """Answer the host's commands until it says shut down (or dies)."""
        from mpi4py import MPI

        backoff = _Backoff()
        st = MPI.Status()
        while True:
            if self.ctrl.Iprobe(source=0, tag=CMD, status=st):
                cmd, sid, run_id, payload = self.ctrl.recv(source=0, tag=CMD)
                if cmd == "shutdown":
                    self.ctrl.send(("bye", self.rank, 0, None), dest=0, tag=REPLY)
                    if self.watchdog is not None:
                        self.watchdog.stop()
                    if self.beat is not None and not self.beat.close():
                        exit_process(f"MPI rank {self.rank}: a peer did not end its "
                                     f"heartbeats (MPI could not finalise)", 0)
                    return
                try:
                    reply = ("ok", self.rank, run_id,
                             self.service.handle(cmd, sid, run_id, payload))
                except RunAborted as e:
                    reply = ("aborted", self.rank, run_id, (message_of(e), flight_of(e)))
                except CollectiveTimeout as e:
                    reply = ("timeout", self.rank, run_id,
                             (message_of(e), tuple(e.workers), flight_of(e)))
                except WorkerDied as e:
                    # Another worker died while this one waited for it: the host reports the
                    # death (WorkerDied naming it), not this worker's failed collective.
                    reply = ("died", self.rank, run_id,
                             (str(e), tuple(getattr(e, "workers", ()) or ()),
                              isinstance(e, HostUnreachable)))
                except BaseException as e:  # noqa: BLE001 - reported to the host
                    reply = ("error", self.rank, run_id, (reported(e), flight_of(e)))
                    if os.environ.get("POPXL_DEBUG"):
                        traceback.print_exc()
                self.ctrl.send(reply, dest=0, tag=REPLY)
                backoff = _Backoff()
            elif self.ctrl.Iprobe(source=0, tag=ABORT, status=st):
                self.ctrl.recv(source=0, tag=ABORT)      # stale: that run already ended here
            else:
                now = time.monotonic()
                if now - self._last_liveness > _LIVENESS_PERIOD or self._peer_signal:
                    self._last_liveness = now
                    if self._dead_peers([0]):
                        # Nothing to serve; MPI_Finalize would wait for the host for ever.
                        exit_process(f"MPI rank {self.rank}: the host (MPI rank 0, pid "
                                     f"{self.procs[0][1]}) died")
                    self._exit_if_host_unreachable()
                backoff.wait()


def spanning_heartbeat(world, procs) -> Optional[MPIHeartbeat]:
    """Heartbeats over a duplicate of `world` when its ranks (`procs`: (host, pid) per rank)
    span hosts (collective: every rank of `world` calls it, and all decide alike); None on one
    host, where process checks tell a rank's death, or without MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI

    if len({host for host, _ in procs}) < 2 or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return None
    return MPIHeartbeat(returning_errors(world.Dup()), peer_timeout())


def returning_errors(comm):
    """`comm`, set to return errors (mpi4py raises them) instead of aborting the job: across
    hosts MPI reports a peer that died as an error of a call towards it."""
    from mpi4py import MPI

    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


_POOL: Optional[MPIPool] = None
_LAUNCHED = False


def launched_by_popxl_run() -> None:
    """Mark this process as started by the popxl-run MPI entry point."""
    global _LAUNCHED
    _LAUNCHED = True


def mpi_pool() -> MPIPool:
    """The process-wide MPI pool (created by the popxl-run entry point)."""
    global _POOL
    if _POOL is None:
        try:
            from mpi4py import MPI
        except ModuleNotFoundError as e:
            if e.name != "mpi4py":
                raise
            raise ModuleNotFoundError('POPXL_BACKEND=mpi: mpi4py is not installed (the mpi '
                                      'extra: pip install -e ".[mpi]" in the popxl-dist clone)',
                                      name="mpi4py") from None
        size = MPI.COMM_WORLD.Get_size()
        want = worker_count(default=size)
        if not _LAUNCHED and (size > 1 or want > 1):
            raise RuntimeError(
                f"POPXL_BACKEND=mpi with {want} workers: start the script with "
                f"`popxl-run --backend mpi --workers {want} script.py` (this process is "
                f"{'one of ' + str(size) if size > 1 else 'a single'} MPI rank(s) not started "
                f"by popxl-run)")
        if want != size:
            raise RuntimeError(f"POPXL_WORKERS={want} but MPI started {size} rank(s)")
        _POOL = MPIPool()
    return _POOL


