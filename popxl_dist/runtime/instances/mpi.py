"""Instances over MPI: one rank per instance (poprun, `mpirun -n N python script.py`).

Two communicators duplicated from `COMM_WORLD` (never `COMM_WORLD` itself, so the script's own
mpi4py traffic never mixes with ours): `data` carries the collectives' bytes, `ctrl` the notices
(an instance failed / said goodbye). Every wait polls (see `mpi._Backoff`), reads notices, checks
that the peers it waits for are alive, and notices a peer that sends data of another run or
collective (diverged), so no collective hangs.

MPI orders the messages of one communicator only, so a goodbye on `ctrl` may be read before the
last data its sender put on `data`: every goodbye says how many data messages its sender sent to
the receiver, and a peer that said goodbye is reported as gone from a collective only when the
data it owes was never sent.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ...errors import CollectiveTimeout, InstanceFailed, WorkerDied
from ..backends.mpi import (
    MPITransport,
    _alive,
    _Backoff,
    broken_peers,
    returning_errors,
    spanning_heartbeat,
)
from ..process.mpi_segments import unlink_mpich_segments
from ..transport.reachability import host_unreachable
from .group import ACK_GRACE, InstanceGroup, flush_stdio

__all__ = ["MPIInstanceGroup", "abort_before_first_session"]

NOTICE = 21
_LIVENESS_PERIOD = 0.5
_CHECK_PERIOD = 0.001     # seconds between looks at notices / peers while a collective waits
_RUN_BITS, _TAG_BITS = 13, 15


def _mpi_tag(run_id: int, tag: int) -> int:
    return ((run_id % (1 << _RUN_BITS)) << _TAG_BITS) | tag


def _split_tag(mtag: int) -> Tuple[int, int]:
    return mtag >> _TAG_BITS, mtag & ((1 << _TAG_BITS) - 1)


class _InstanceTransport(MPITransport):
    """Collective bytes between instances (receive buffers reused as in `MPITransport`)."""

    def __init__(self, group: "MPIInstanceGroup"):
        super().__init__(group)
        self.group = group
        self.sent_to: Dict[int, int] = {}        # data messages sent to each peer, ever
        self.posted_from: Dict[int, int] = {}    # data messages expected from each peer, ever

    def exchange(self, sends, recvs, tag):
        group = self.group
        MPI = group.MPI
        mtag = _mpi_tag(self.run_id, tag)
        bufs = {p: self._buffer(p, n, dtype) for p, (n, dtype) in recvs.items()}
        pending: Dict[int, object] = {}
        by_peer: Dict[int, list] = {}
        sreqs: list = []
        try:
            for p in bufs:
                pending[p] = group.data.Irecv([bufs[p].view(np.uint8), MPI.BYTE], source=p,
                                              tag=mtag)
                by_peer.setdefault(p, []).append(pending[p])
            keep = [np.ascontiguousarray(a) for a in sends.values()]
            for p, a in zip(sends, keep):
                sreqs.append(group.data.Isend([a.view(np.uint8), MPI.BYTE], dest=p, tag=mtag))
                by_peer.setdefault(p, []).append(sreqs[-1])
        except MPI.Exception as e:
            err = group.connection_lost(broken_peers(by_peer) or list(by_peer), e)
            group.mark_broken(err)
            raise err from None
        for p in bufs:
            self.posted_from[p] = self.posted_from.get(p, 0) + 1
        for p in sends:
            self.sent_to[p] = self.sent_to.get(p, 0) + 1
        start = time.monotonic()
        next_check = start + _CHECK_PERIOD
        backoff = _Backoff()
        try:
            while True:
                for p in [p for p, r in pending.items() if r.Test()]:
                    del pending[p]
                if not pending and MPI.Request.Testall(sreqs):
                    break
                now = time.monotonic()
                if now >= next_check:        # notices, liveness, divergence: not every poll
                    next_check = now + _CHECK_PERIOD
                    group.check(pending, mtag)
                    if now - start > group.timeout:
                        silent = sorted(pending) or sorted(sends)
                        err = CollectiveTimeout(
                            f"instance {group.index}: collective (tag {tag}) got no data from "
                            f"instance(s) {silent} within {group.timeout:g} s "
                            f"(POPXL_COLLECTIVE_TIMEOUT)")
                        err.workers, err.timeout = tuple(silent), group.timeout
                        raise err
                backoff.wait()
        except BaseException as e:
            lost = group.connection_lost(broken_peers(by_peer) or list(by_peer), e) \
                if isinstance(e, MPI.Exception) else None
            group.mark_broken(lost or e)
            for r in pending.values():
                try:
                    r.Cancel()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            if lost is not None:
                raise lost from None
            raise
        return bufs


class MPIInstanceGroup(InstanceGroup):
    """The instances of an MPI launch; instance i is rank i of `COMM_WORLD`."""

    name = "mpi"

    def __init__(self, index: int, size: int):
        super().__init__(index, size)
        try:
            from mpi4py import MPI
        except ModuleNotFoundError as e:
            if e.name != "mpi4py":
                raise
            raise ModuleNotFoundError('popdist instances over MPI: mpi4py is not installed (the '
                                      'mpi extra: pip install -e ".[mpi]" in the popxl-dist '
                                      'clone)', name="mpi4py") from None
        world = MPI.COMM_WORLD
        if (world.Get_rank(), world.Get_size()) != (index, size):
            raise RuntimeError(f"popdist says this is instance {index} of {size}, but it is MPI "
                               f"rank {world.Get_rank()} of {world.Get_size()}: launch one MPI "
                               f"rank per instance (poprun / mpirun -n {size})")
        self.MPI = MPI
        self.rank = index
        self.data = returning_errors(self._dup(world))
        self.ctrl = returning_errors(self._dup(world))
        # peer -> (kind, origin, message, data messages it sent to this instance)
        self.gone: Dict[int, Tuple[str, int, str, int]] = {}
        self._last_liveness = time.monotonic()
        self._peer_signal = False
        self.transport = _InstanceTransport(self)
        self.procs = self.allgather((socket.gethostname(), os.getpid()))
        # Every instance has attached MPICH's shared memory by now: unlinked, it goes with the
        # last process however the job ends (a killed or aborted job would leave it behind).
        unlink_mpich_segments()
        # Across hosts, heartbeats tell a host that stopped answering (transport/mpi_heartbeat.py).
        self.beat = spanning_heartbeat(world, self.procs)
        self._peer_signal_at = 0.0
        self._usr1 = threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        if self._usr1:
            # Under popxl's launchers hydra (-disable-auto-cleanup) signals SIGUSR1 when a rank
            # exits: look at the peers at once instead of at the next liveness period.
            signal.signal(signal.SIGUSR1, self._on_peer_exit)

    def _on_peer_exit(self, signum, frame) -> None:
        self._peer_signal = True
        self._peer_signal_at = self._peer_signal_at or time.monotonic()

    def _ignore_exit_notices(self) -> None:
        """Back to ignoring hydra's SIGUSR1: Python resets the signals it handles to their
        default action (terminate) when it finalises, and MPI_Finalize then waits for the other
        ranks, whose exits signal this one."""
        if self._usr1 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _dup(self, world):
        """`world.Dup()` without blocking forever if an instance never gets here."""
        comm, req = world.Idup()
        deadline = time.monotonic() + self.timeout
        backoff = _Backoff()
        while not req.Test():
            if time.monotonic() > deadline:
                raise CollectiveTimeout(
                    f"instance {self.index}: the other instances did not start their popdist "
                    f"Session within {self.timeout:g} s (POPXL_COLLECTIVE_TIMEOUT)")
            backoff.wait()
        return comm

    # --- notices and liveness -------------------------------------------------------------
    def _read_notices(self) -> None:
        MPI = self.MPI
        st = MPI.Status()
        while self.ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE, status=st):
            kind, origin, message, sent = self.ctrl.recv(source=st.Get_source(), tag=NOTICE)
            self.gone.setdefault(st.Get_source(), (kind, origin, message, sent))

    def _left_without(self, peer: int) -> bool:
        """Whether `peer` said goodbye without sending all the data this instance expects from
        it (its goodbye may overtake data it did send: that data is on its way)."""
        kind, _, _, sent = self.gone[peer]
        return kind != "failed" and sent < self.transport.posted_from.get(peer, 0)

    def check(self, waiting: Dict[int, object], mtag: int) -> None:
        """Raise if the launch failed, or a peer in `waiting` (peer -> its pending receive)
        exited, died or diverged."""
        MPI = self.MPI
        self._read_notices()
        for peer, (kind, origin, message, _) in sorted(self.gone.items()):
            if kind == "failed":
                raise InstanceFailed(f"instance {origin} failed: {message}", origin)
        st = MPI.Status()
        for peer, req in waiting.items():
            # A message of another collective from a peer whose data for this one has not
            # arrived means it skipped this one (messages between two ranks do not overtake:
            # the test after the probe sees any earlier arrival).
            if self.data.Iprobe(source=peer, tag=MPI.ANY_TAG, status=st) \
                    and st.Get_tag() != mtag and not req.Test():
                (run, tag), (want_run, want_tag) = _split_tag(st.Get_tag()), _split_tag(mtag)
                raise InstanceFailed(
                    f"instance {peer} is in another collective (run {run}, tag {tag}) than "
                    f"instance {self.index} (run {want_run}, tag {want_tag}): the instances "
                    f"diverged (they must build the same programs and run them in the same "
                    f"order)", peer)
        for peer in waiting:
            if peer in self.gone and self._left_without(peer):
                raise InstanceFailed(f"instance {peer} ended its script without joining this "
                                     f"collective (it exited): the instances diverged", peer)
        now = time.monotonic()
        if now - self._last_liveness > _LIVENESS_PERIOD or self._peer_signal:
            self._last_liveness = now
            self._peer_signal = False
            dead = self._dead(list(waiting))
            if self.beat is not None:
                dead += [p for p in waiting if p in self.beat.failed and p not in dead]
            silent = self.beat.silent(waiting) if self.beat is not None else []
            if not dead and silent:
                self._read_notices()
                if not any(p in self.gone for p in silent):
                    raise self._unreachable(silent)
            if dead:
                self._read_notices()          # a goodbye / failure notice says more
                if not any(p in self.gone for p in dead):
                    host, pid = self.procs[dead[0]]
                    err = WorkerDied(f"instance {dead[0]} (MPI rank {dead[0]}, pid {pid} on "
                                     f"{host}) died")
                    err.workers = dead
                    err.instance = dead[0]
                    raise err
                self.check(waiting, mtag)

    def _dead(self, peers: Sequence[int]) -> List[int]:
        """The peers whose process is gone: on this host by pid; on another host, those that
        stopped beating when the process manager said that a rank ended."""
        host = socket.gethostname()
        dead = [p for p in peers if self.procs[p][0] == host and not _alive(self.procs[p][1])]
        remote = [p for p in peers if self.procs[p][0] != host]
        if self.beat is not None and self._peer_signal_at and remote and \
                time.monotonic() - self._peer_signal_at > 2 * self.beat.period + 0.1:
            dead += self.beat.quiet_since(self._peer_signal_at, remote)
        return dead

    def connection_lost(self, peers: Sequence[int], exc: BaseException) -> WorkerDied:
        """WorkerDied naming the instances whose connection MPI reports broken (`exc`)."""
        if self.beat is not None:
            self.beat.failed.update(peers)
        p = sorted(peers)[0]
        host, pid = self.procs[p]
        err = WorkerDied(f"instance {p} (MPI rank {p}, pid {pid} on {host}) died (MPI: "
                         f"{str(exc).splitlines()[0]})")
        err.workers, err.instance = sorted(peers), p
        return err

    def _unreachable(self, silent: Sequence[int]):
        """HostUnreachable naming the silent instances' hosts and every instance on them."""
        hosts = {self.procs[p][0]: "" for p in silent}
        members = {p: (h, f"MPI rank {p}, pid {pid}") for p, (h, pid) in enumerate(self.procs)
                   if p != self.index}
        err = host_unreachable(hosts, members, self.beat.timeout, noun="instance",
                               heartbeats=True)
        err.instance = err.workers[0] if err.workers else silent[0]
        return err

    # --- ending ---------------------------------------------------------------------------
    def _notify(self, kind: str, origin: int, message: str) -> list:
        # Failed peers still wait for this notice (as their acknowledgement); gone ones do not.
        sent = self.transport.sent_to
        return [self.ctrl.isend((kind, origin, message, sent.get(p, 0)), dest=p, tag=NOTICE)
                for p in self.peers if p not in self.gone or self.gone[p][0] == "failed"]

    def fail(self, message: str, origin: int) -> bool:
        if self.closed:
            return True
        self.closed = True
        self._ignore_exit_notices()
        self._notify("failed", origin, message)
        deadline = time.monotonic() + ACK_GRACE
        backoff = _Backoff()
        while time.monotonic() < deadline:
            self._read_notices()
            missing = [p for p in self.peers if p not in self.gone]
            if not missing:
                self._end_heartbeats(ACK_GRACE)
                return True
            if not [p for p in missing if p not in self._dead(missing)]:
                # Nobody left to tell, but MPI_Finalize would wait for the dead: end here (an
                # MPI_Abort would make the process manager kill every rank, output unflushed).
                flush_stdio()
                os._exit(1)
            backoff.wait()
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._ignore_exit_notices()
        reqs = self._notify("bye", self.index, "")
        # Read the others' goodbyes too (they close about now): a notice left unread makes
        # MPICH's UCX transport warn at MPI_Finalize. Bounded: one may still be computing.
        deadline = time.monotonic() + _BYE_PATIENCE
        backoff = _Backoff()
        while time.monotonic() < deadline:
            self._read_notices()
            missing = [p for p in self.peers if p not in self.gone]
            if self.MPI.Request.Testall(reqs) and not [
                    p for p in missing if p not in self._dead(missing)
                    and not (self.beat is not None and p in self.beat.silent(missing))]:
                break
            backoff.wait()
        self._end_heartbeats(_BYE_PATIENCE)

    def _end_heartbeats(self, patience: float) -> None:
        """Stop the heartbeats before MPI finalises; end the process if a peer's host stopped
        answering (MPI_Finalize would wait for it for ever)."""
        if self.beat is not None and not self.beat.close(patience=patience) \
                and self.beat.silent(self.peers):
            flush_stdio()
            os._exit(1)

    def abort(self, code: int) -> None:
        flush_stdio()
        if _under_popxl_launcher():
            os._exit(code)       # the launcher stops the others (and keeps every exit code)
        self.MPI.COMM_WORLD.Abort(code)


def _under_popxl_launcher() -> bool:
    """Whether poprun / `popxl-run --instances` runs this instance: it stops the others a few
    seconds after one fails, so no MPI_Abort is needed (a plain mpiexec has nobody else)."""
    return bool(os.environ.get("POPXL_EXIT_DIR"))


# Seconds a failing instance waits to join MPI in order to abort it: the others join when they
# create their first Session, which on a loaded machine can take many seconds (5 s was too short).
_INIT_PATIENCE = 20.0
_BYE_PATIENCE = 10.0       # seconds an ending instance waits for the others' goodbyes


def abort_before_first_session() -> None:
    """An instance failed before its first popdist Session. The others may be waiting for it in
    MPI (in MPI_Init, which completes only when every rank joins, or in the Session's first
    collective), and MPI cannot finalise while they do: join MPI if needed (giving up after
    `_INIT_PATIENCE` seconds, when the others are not waiting there) and abort the job. MPI_Init
    returns only once every rank of the node has mapped MPICH's shared memory, so its name is
    removed first (MPI_Abort would leave it in /dev/shm). Under popxl's own launchers nothing is
    needed: they stop the others."""
    if _under_popxl_launcher():
        return

    def abort() -> None:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            unlink_mpich_segments()
            # Said before MPI_Abort: hydra may stop forwarding output as the abort arrives, so
            # MPICH's own "application called MPI_Abort" line is sometimes lost.
            print(f"popxl: MPI rank {MPI.COMM_WORLD.Get_rank()} failed before its first popdist "
                  f"Session: aborting the MPI job (MPI_Abort)", file=sys.stderr, flush=True)
            flush_stdio()
            time.sleep(0.2)          # lets the launcher forward this output before the abort
            MPI.COMM_WORLD.Abort(1)

    if "mpi4py.MPI" in sys.modules:
        abort()
        return
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return
    t = threading.Thread(target=abort, name="popxl-abort", daemon=True)
    t.start()
    t.join(_INIT_PATIENCE)
