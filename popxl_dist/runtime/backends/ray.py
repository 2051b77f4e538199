"""The `ray` backend: worker 0 is the driver (the user's script, serving the first block of
replicas itself, as MPI rank 0 does); workers 1..W-1 are Ray actors, on a local Ray (started on
first use) or on the cluster at `POPXL_RAY_ADDRESS` / `RAY_ADDRESS`.

Ray only places, starts and supervises the workers. Each actor runs one long-lived `serve()`
call (its object reference is the liveness check); commands, replies and collective data go
through the pool's own links (`transport/mesh.py`): shared-memory rings between processes of one
Ray node, TCP sockets between nodes, with one message protocol (`transport/links.py`). Ray's
per-call machinery (~1.5-2 ms a call here) is paid only at start-up.

Failures: a worker that raises becomes a WorkerError naming it; a dead worker a WorkerDied
within about a second, even while the driver computes its own replicas (a watchdog thread
checks the workers and interrupts the driver); a collective that waits longer than
POPXL_COLLECTIVE_TIMEOUT a CollectiveTimeout. Every wait is bounded or watched. A pool that lost
a worker is discarded (its actors killed); the next Session gets a new one. Ctrl-C, exceptions
and a killed driver leave no actors, no Ray processes it started, and no shared-memory segment.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import subprocess
import sys
import time
from typing import Any, List, Optional, Sequence

from ...errors import CollectiveTimeout, WorkerDied, WorkerError
from ..cores import DEPRECATED_THREADS_VAR, set_local_workers
from ..env import collective_timeout, ray_transport
from ..process.liveness import Watchdog, exit_process
from ..process.polling import Backoff, process_start_time, process_stopped
from ..process.proc_tree import descendants
from ..process.ray_init import init_ray, spans_nodes
from ..transport.endpoint import (
    ABORTED,
    DIED,
    ERROR,
    LIVENESS_PERIOD,
    Endpoint,
    EndpointTransport,
    Silence,
    decode,
    describe,
    encode,
    lost_error,
    serve,
)
from ..transport.links import ABORT, BYE, CMD, FIN
from ..transport.mesh import MeshMember, listen_address, new_token
from ..transport.pipes import shm_supported, unlink_segments
from ..transport.reported import host_error, with_flights
from .pool import WorkerPool
from .service import WorkerService

__all__ = ["RayPool", "ray_pool"]

_ABORT_GRACE = 5.0       # seconds the other workers get to stop after a failure
_CLOSE_GRACE = 10.0      # seconds a session close or a shutdown waits for the workers
_SETUP_TIMEOUT = 180.0   # seconds for the actors to start and connect
_FIN_DELAY = 0.05        # tell waiting workers who finished once a run takes this long
_STATS = "__transport_stats__"
# Run by path, not imported: it must outlive the driver without importing popxl.
REAPER_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "process", "ray_reaper.py")


def _actor_env() -> dict:
    """The actors' environment. BLAS runs one thread inside a worker's computation (see
    runtime/blas.py; Ray would set its variables to the actor's CPU count), and the job's
    `POPXL_THREADS` (threads per worker, runtime/cores.py) reaches every actor."""
    env = {var: "1" for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    for var in ("POPXL_THREADS", DEPRECATED_THREADS_VAR):
        if os.environ.get(var, "").strip():
            env[var] = os.environ[var]
    # Idle BLAS threads of several actors per core would spin against each other.
    env["OPENBLAS_THREAD_TIMEOUT"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "4")
    if "POPXL_PEER_TIMEOUT" in os.environ:       # (their sockets' keepalive)
        env["POPXL_PEER_TIMEOUT"] = os.environ["POPXL_PEER_TIMEOUT"]
    # Ray starts workers at niceness 15: with any other load on the node they would starve,
    # and every collective (and the driver, worker 0) waits for the slowest worker. MPI ranks
    # run at normal priority; so do ours.
    env["RAY_worker_niceness"] = "0"
    return env


def _node_and_ip() -> tuple:
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _on_node(table: List[dict], node: str) -> int:
    """How many of the pool's workers run on `node` (they share its cores: runtime/cores.py)."""
    return sum(1 for member in table if member.get("node") == node)


def _stats(endpoint: Endpoint, transport: EndpointTransport, node: str) -> dict:
    return {"worker": endpoint.index, "node": node, "pid": os.getpid(),
            "links": {p: link.kind for p, link in endpoint.links.items()},
            "data_bytes_sent": dict(transport.data_sent)}


class _ActorWorker:
    """The body of worker actor `index` (wrapped with `ray.remote` on first use)."""

    def __init__(self, index: int, size: int, job: str, token: bytes, timeout: float,
                 use_shm: bool, spans: bool):
        self.node, ip = _node_and_ip()
        self.endpoint = Endpoint(index, timeout)
        self.endpoint.what = "Ray actor"
        use_shm = use_shm and shm_supported()
        self.mesh = MeshMember(self.endpoint, job, token, size, self.node, ip, use_shm,
                               listen_address(spans, use_shm, ip))

    def hello(self) -> dict:
        return self.mesh.hello()

    def connect(self, table: List[dict]) -> None:
        self.mesh.connect(table)
        set_local_workers(_on_node(table, self.node))

    def attach(self) -> None:
        self.mesh.attach()

    def serve(self) -> str:
        """Answer the driver's commands until it says goodbye (or is gone). A driver that is
        unreachable ends this process: nobody would ever stop it (Ray cannot tell an actor on
        a host cut off from the cluster that its job ended)."""
        ep = self.endpoint
        self.mesh.finish()
        finished = ep.finished

        def peer_finished(run_id: int, waiting: Sequence[int]) -> bool:
            return any(w in finished.get(run_id, ()) for w in waiting)

        transport = EndpointTransport(ep, peer_finished)
        service = WorkerService(ep.index, transport, transport.start_run)
        watch = Watchdog(lambda: _driver_lost(ep, "while computing"), period=LIVENESS_PERIOD,
                         name="popxl-ray-actor-watchdog")
        try:
            why = serve(ep, service.handle,
                        {_STATS: lambda _: _stats(ep, transport, self.node)})
        finally:
            watch.stop()
        if why != "bye":
            _driver_lost(ep, "")
        ep.close()
        return why


def _driver_lost(ep: Endpoint, when: str) -> None:
    """End this actor's process when the driver (worker 0) is unreachable, judged from its
    link's state alone (so a watchdog thread may call it). A driver that ended is Ray's to
    handle: it kills the actors of a job whose driver is gone."""
    link = ep.links.get(0)
    if link is not None and link.probe() and link.unreachable:
        host = ep.procs.get(0, ("?", 0))[0]
        exit_process(f"Ray worker {ep.index}: the driver (worker 0, on {host}) is "
                     f"unreachable{' ' + when if when else ''}")


# --- Ray and the reaper: started once per process ------------------------------------------------
class _RayProcess:
    """This process's use of Ray: whether it started a local Ray (then it also runs the reaper
    and shuts Ray down at exit)."""

    def __init__(self):
        self.started = False
        self.registered = False            # shutdown() runs at exit
        self.reaper: Optional[subprocess.Popen] = None

    def ensure(self, actors: int) -> None:
        if not init_ray(max(actors, os.cpu_count() or 1), actors):
            return
        self.started = True
        self.reaper = subprocess.Popen(
            [sys.executable, REAPER_SCRIPT],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            text=True)

    def watch(self, shm_prefix: str) -> None:
        """Tell the reaper about the job's current processes and segments."""
        if self.reaper is None:
            return
        lines = [f"shm {shm_prefix}"]
        for pid in descendants(os.getpid()):
            if pid != self.reaper.pid:
                lines.append(f"kill {pid} {process_start_time(pid)}")
        self._tell("\n".join(lines) + "\n")

    def _tell(self, text: str) -> None:
        try:
            self.reaper.stdin.write(text)
            self.reaper.stdin.flush()
        except (OSError, ValueError):
            pass

    def shutdown(self) -> None:
        """At exit: the pool, then the Ray this process started, then the reaper."""
        import ray

        if _POOL is not None:
            _POOL.shutdown()
        if self.started and ray.is_initialized():
            ray.shutdown()
        if self.reaper is not None:
            self._tell("done\n")
            try:
                self.reaper.stdin.close()
                self.reaper.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.reaper = None


_RAY = _RayProcess()


# --- the pool --------------------------------------------------------------------------------
class RayPool(WorkerPool):
    """`size` workers: this process (worker 0) and `size - 1` Ray actors, shared by every
    Session of the script."""

    name = "ray"

    def __init__(self, size: int):
        self.size = size
        self.broken: Optional[str] = None
        self.closed = False
        self.job = f"popxl-ray-{os.getpid()}-{secrets.token_hex(12)}"
        self.endpoint = Endpoint(0, collective_timeout())
        self.endpoint.what = "Ray actor"
        self.transport = EndpointTransport(self.endpoint, self._replied_during_collective)
        self.service = WorkerService(0, self.transport, self.transport.start_run)
        self.actors: list = []
        self._serve_refs: list = []
        self.pids: List[int] = [os.getpid()]
        self.node = ""
        self._special = {_STATS: lambda _: _stats(self.endpoint, self.transport, self.node)}
        self._watch: Optional[Watchdog] = None
        self._computing = False              # the driver computes its replicas (no polling)
        if size > 1:
            self._start()

    # --- start-up ------------------------------------------------------------------------------
    def _start(self) -> None:
        import ray

        _RAY.ensure(self.size - 1)
        self.node, ip = _node_and_ip()
        use_shm = ray_transport() == "auto" and shm_supported()
        spans = spans_nodes()
        token = new_token()
        timeout = self.endpoint.timeout
        cls = ray.remote(num_cpus=1)(_ActorWorker)
        opts = {"runtime_env": {"env_vars": _actor_env()},
                "scheduling_strategy": "SPREAD"}
        mesh = MeshMember(self.endpoint, self.job, token, self.size, self.node, ip, use_shm,
                          listen_address(spans, use_shm, ip))
        try:
            self.actors = [cls.options(**opts).remote(i, self.size, self.job, token, timeout,
                                                      use_shm, spans)
                           for i in range(1, self.size)]
            table = [mesh.hello()] + ray.get([a.hello.remote() for a in self.actors],
                                             timeout=_SETUP_TIMEOUT)
            ray.get([a.connect.remote(table) for a in self.actors], timeout=_SETUP_TIMEOUT)
            mesh.connect(table)
            set_local_workers(_on_node(table, self.node))
            attached = [a.attach.remote() for a in self.actors]
            mesh.attach()
            ray.get(attached, timeout=_SETUP_TIMEOUT)
            mesh.finish()
        except BaseException as e:
            mesh.abandon()
            self._discard()
            if isinstance(e, ray.exceptions.GetTimeoutError):
                raise WorkerDied(f"the Ray backend could not start {self.size - 1} worker "
                                 f"actor(s) within {_SETUP_TIMEOUT:g} s (cluster resources: "
                                 f"{ray.cluster_resources()})") from e
            raise
        self.pids = [t["pid"] for t in table]
        self._serve_refs = [a.serve.remote() for a in self.actors]
        self._watch = Watchdog(self._watch_check, period=0.5, name="popxl-ray-watchdog")
        _RAY.watch(self.job)

    # --- liveness ------------------------------------------------------------------------------
    def dead_workers(self) -> List[int]:
        """Workers whose process is gone (checked by pid on this host, and by Ray)."""
        import ray

        dead = set(self.endpoint.dead_workers(range(1, self.size)))
        if self._serve_refs:
            ended, _ = ray.wait(self._serve_refs, num_returns=len(self._serve_refs), timeout=0)
            dead.update(self._serve_refs.index(r) + 1 for r in ended)
        return sorted(dead)

    def _watch_check(self) -> Optional[WorkerDied]:
        """The watchdog's check: while the driver computes, a dead worker's error."""
        if not self._computing:
            return None
        dead = self.dead_workers()
        return self.died(dead) if dead else None

    def died(self, dead: Sequence[int]) -> WorkerDied:
        """Mark the pool unusable; the error that names the dead (or unreachable) workers."""
        err = self.endpoint.died(dead)
        self.broken = str(err)
        return self.endpoint.died(dead, suffix="; the Ray worker pool cannot be used again")

    # --- host side -----------------------------------------------------------------------------
    def call(self, sid: int, cmd: str, payloads: Sequence[Any],
             deadline: Optional[float] = None) -> List[Any]:
        if self.broken or self.closed:
            raise WorkerDied(f"the Ray worker pool is unusable: {self.broken or 'shut down'}")
        run_id = next(self._runs)
        workers = range(1, len(payloads))
        ep = self.endpoint
        ep.replies.clear()
        try:
            dead = ep.dead_workers(workers, force=False)
            if dead:
                raise self.died(dead)
            for w in workers:
                meta, bufs = encode((cmd, sid, payloads[w]))
                ep.links[w].post(CMD, run_id, 0, 0, meta, bufs)
            if not ep.flush_all(workers, stall=ep.timeout):
                raise self.died(self.dead_workers() or list(workers))
            special = self._special.get(cmd)
            self._computing = True          # the driver does not poll while it computes
            try:
                with self._watch.armed() if self._watch else contextlib.nullcontext():
                    own = (special(payloads[0]) if special is not None
                           else self.service.handle(cmd, sid, run_id, payloads[0]))
            finally:
                self._computing = False
            self._wait_replies(run_id, workers, deadline)
        except BaseException as e:
            self._abort(run_id, workers, e)
            with_flights(e, self._peer_flights(run_id))
            raise
        return [own] + [decode(ep.replies[w]) for w in workers]

    def _peer_flights(self, run_id: int) -> list:
        """The flight records the other workers sent with their failure or abort replies."""
        out = []
        for m in self.endpoint.replies.values():
            if m.run_id == run_id and m.a in (ERROR, ABORTED):
                try:
                    out.append(decode(m)[1])
                except Exception:  # noqa: BLE001 - a reply that does not decode has none
                    pass
        return out

    def _take_replies(self, run_id: int) -> None:
        """Drop stale replies; raise the first failure reported for this run."""
        replies = self.endpoint.replies
        for w in list(replies):
            m = replies[w]
            if m.run_id != run_id:
                del replies[w]
            elif m.a == ERROR:
                report, flight = decode(m)
                raise with_flights(host_error(report, lambda text: WorkerError(
                    f"worker {w} (Ray actor) failed: {text}")), [flight])
            elif m.a == DIED:
                err = lost_error(decode(m), "; the Ray worker pool cannot be used again")
                self.broken = str(err)
                raise err

    def _wait_replies(self, run_id: int, workers: Sequence[int],
                      deadline: Optional[float]) -> None:
        """Wait for the workers' replies to run `run_id`. A worker that sends nothing for
        POPXL_COLLECTIVE_TIMEOUT seconds meanwhile is stopped, hung or far slower than this
        one: CollectiveTimeout, as in a collective."""
        ep = self.endpoint
        start = time.monotonic()
        told: set = set()                          # (finished worker, waiting worker) pairs
        silence = Silence(ep, workers)
        backoff = Backoff()
        while True:
            moved = ep.progress()
            self._take_replies(run_id)
            pending = [w for w in workers if w not in ep.replies]
            if not pending:
                return
            if moved:
                backoff = Backoff()
                continue
            dead = ep.dead_workers(pending, force=False)
            if dead:
                raise self.died(dead)
            now = time.monotonic()
            if now - start > _FIN_DELAY:
                # Anyone waiting in a collective for a worker that finished has diverged.
                for f in [0, *ep.replies]:
                    for w in pending:
                        if (f, w) not in told:
                            told.add((f, w))
                            ep.links[w].post(FIN, run_id, f)
            if deadline is not None and now > deadline:
                self.broken = f"worker(s) {pending} did not answer within {_CLOSE_GRACE:g} s"
                raise WorkerError(f"worker(s) {pending} (Ray actors) did not answer; the Ray "
                                  f"worker pool cannot be used again")
            quiet = silence.over(ep.timeout, pending)
            if quiet:
                raise ep.silent(quiet, ep.timeout, "sent nothing for {t:g} s while worker 0 "
                                                   "waited for its reply")
            backoff.wait()

    def _replied_during_collective(self, run_id: int, waiting: Sequence[int]) -> bool:
        """The host's check while it waits in a collective: raise if another worker failed;
        True if one it waits for has already finished the run."""
        self._take_replies(run_id)
        return any(w in self.endpoint.replies for w in waiting)

    def _abort(self, run_id: int, workers: Sequence[int], exc: BaseException) -> None:
        """Stop the other workers' part of a failed run and collect their replies; a pool
        whose workers cannot be stopped (dead, stuck, or the driver was interrupted) is
        discarded."""
        ep = self.endpoint
        if isinstance(exc, WorkerDied) or not isinstance(exc, Exception) or self.broken:
            self.broken = self.broken or f"a run was interrupted ({describe(exc)})"
            self._discard()
            return
        pending = [w for w in workers if w not in ep.replies]
        silent = [w for w in getattr(exc, "workers", ()) if w in pending] \
            if isinstance(exc, CollectiveTimeout) else []
        if silent:
            # They sent nothing for the whole timeout (stopped or hung): they cannot take an
            # abort either, and waiting for them would only delay the error.
            self.broken = (f"worker(s) {silent} sent nothing within {ep.timeout:g} s "
                           f"(stopped or hung?)")
            self._discard()
            return
        reason = f"another worker failed: {describe(exc)}".encode()
        for w in pending:
            ep.links[w].post(ABORT, run_id, 0, 0, reason)
        deadline = time.monotonic() + _ABORT_GRACE
        backoff = Backoff()
        while any(w not in ep.replies for w in pending):
            if not ep.progress():
                if (time.monotonic() > deadline or ep.dead_workers(pending, force=False)
                        or self._all_stopped([w for w in pending if w not in ep.replies])):
                    stuck = [w for w in pending if w not in ep.replies]
                    self.broken = f"worker(s) {stuck} did not stop after a failure"
                    self._discard()
                    return
                backoff.wait()
            for w in list(ep.replies):
                if ep.replies[w].run_id != run_id:
                    del ep.replies[w]

    def _all_stopped(self, workers: Sequence[int]) -> bool:
        """Whether every one of `workers` is a stopped process on this host (it cannot answer;
        waiting for it would only delay the error)."""
        host = self.endpoint.host
        procs = self.endpoint.procs
        return all(procs[w][0] == host and process_stopped(procs[w][1]) for w in workers)

    def close_session(self, sid: int) -> None:
        """As `WorkerPool.close_session` (deferred while a call runs), bounded by
        _CLOSE_GRACE: a stuck worker cannot hold the Session's exit."""
        if self.closed or self.broken:
            return
        if self._busy:
            self._closing = self._closing + [sid]
            return
        self.call(sid, "close", [None] * self.size, deadline=time.monotonic() + _CLOSE_GRACE)

    def transport_stats(self) -> List[dict]:
        """Per worker: its node, pid, the kind of each of its links, and the collective bytes
        it sent through shared memory and through sockets (a popxl-dist extension)."""
        return self.call(0, _STATS, [None] * self.size)

    # --- shutdown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Say goodbye to the workers, then make sure their actors are gone."""
        if self.closed:
            return
        if not self.broken and self.actors:
            ep = self.endpoint
            for w in range(1, self.size):
                ep.links[w].post(BYE, 0)
            if ep.flush_all(range(1, self.size), time.monotonic() + _CLOSE_GRACE):
                import ray

                ray.wait(self._serve_refs, num_returns=len(self._serve_refs),
                         timeout=_CLOSE_GRACE)
        self._discard()

    def _discard(self) -> None:
        """Kill the actors and free the links (bounded: nothing here waits for a worker)."""
        self.closed = True
        if self._watch is not None:
            self._watch.stop()
        if self.actors:
            import ray

            for a in self.actors:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            self.actors = []
        self.endpoint.close()
        unlink_segments(self.job)


_POOL: Optional[RayPool] = None


def ray_pool(size: int) -> RayPool:
    """The process-wide Ray pool of `size` workers (recreated after a worker died)."""
    global _POOL
    if _POOL is not None and (_POOL.closed or _POOL.broken or _POOL.size != size):
        _POOL.shutdown()
        _POOL = None
    if _POOL is None:
        try:
            import ray  # noqa: F401
        except ModuleNotFoundError as e:
            if e.name != "ray":
                raise
            raise ModuleNotFoundError('POPXL_BACKEND=ray: Ray is not installed (the ray extra: '
                                      'pip install -e ".[ray]" in the popxl-dist clone)',
                                      name="ray") from None
        if not _RAY.registered:
            _RAY.registered = True
            atexit.register(_RAY.shutdown)
        _POOL = RayPool(size)
    return _POOL
