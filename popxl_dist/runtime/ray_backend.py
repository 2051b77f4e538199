"""The `ray` backend: one Ray actor per worker, on a local Ray (started on first use) or on the
cluster at `POPXL_RAY_ADDRESS`.

Ray 2.60 ships no CPU collective backend without torch, so collectives are ours: each actor has a
`Mailbox`, and peers push arrays into it through actor calls (`deliver`), which run on the
actor's other threads while `handle` executes the program. The host waits on every worker's
result at once, so the first failure (an exception or a dead actor) is raised at once and the
other workers are released from their collectives.
"""
from __future__ import annotations

import atexit
import logging
import os
from typing import Any, List, Optional, Sequence

from ..errors import RunAborted, WorkerDied, WorkerError
from .env import collective_timeout, ray_address
from .mailbox import Mailbox, MailboxTransport
from .pool import WorkerPool
from .service import WorkerService

__all__ = ["RayPool", "ray_pool"]

_ABORT_GRACE = 5.0
_POLL = 0.5          # seconds between checks for failures while workers run


class _ActorWorker:
    """The body of a worker actor (wrapped with `ray.remote` on first use)."""

    def __init__(self, index: int, timeout: float):
        self.index = index
        self.mailbox = Mailbox()
        self.peers: list = []
        self.transport = MailboxTransport(index, self.mailbox, self._deliver, timeout)
        self.service = WorkerService(index, self.transport, self._on_run)

    def set_peers(self, peers: list) -> int:
        self.peers = peers
        return os.getpid()

    def _deliver(self, peer: int, src: int, run_id: int, tag: int, arr) -> None:
        # `.remote` serialises the array before returning, so the caller may reuse it.
        self.peers[peer].deliver.remote(src, run_id, tag, arr)

    def _on_run(self, run_id: int) -> None:
        self.transport.start_run(run_id)

    def deliver(self, src: int, run_id: int, tag: int, arr) -> None:
        self.mailbox.put(src, run_id, tag, arr)

    def abort(self, run_id: int, reason: str) -> None:
        self.mailbox.abort(run_id, reason)

    def peer_finished(self, src: int, run_id: int) -> None:
        self.mailbox.peer_finished(src, run_id)

    def handle(self, cmd: str, sid: int, run_id: int, payload: Any) -> Any:
        return self.service.handle(cmd, sid, run_id, payload)


def _blas_threads_env() -> dict:
    """The BLAS thread counts of this process, for the actors: Ray would set them to the actor's
    CPU count (1), and OpenBLAS gives different bits with different thread counts, which would
    break bitwise agreement with the local and MPI backends."""
    default = str(os.cpu_count() or 1)
    env = {var: os.environ.get(var, default)
           for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    # Idle BLAS threads of several actors per core would spin against each other.
    env["OPENBLAS_THREAD_TIMEOUT"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "4")
    return env


def _cause(exc: BaseException) -> BaseException:
    """The worker-side exception inside a RayTaskError."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class RayPool(WorkerPool):
    """`size` actors, created at once and shared by every Session of the script."""

    name = "ray"

    def __init__(self, size: int):
        import ray

        self._ray = ray
        self.started_ray = False
        if not ray.is_initialized():
            address = ray_address()
            if address:
                ray.init(address=address, logging_level=logging.WARNING,
                         configure_logging=False)
            else:
                # address="local": a new Ray, not the one `ray start` last left on this machine.
                ray.init(address="local", num_cpus=max(size, os.cpu_count() or 1),
                         include_dashboard=False,
                         logging_level=logging.WARNING, configure_logging=False)
                self.started_ray = True
        self.size = size
        self.broken: Optional[str] = None
        cls = ray.remote(max_concurrency=8, num_cpus=1)(_ActorWorker)
        timeout = collective_timeout()
        env = {"env_vars": _blas_threads_env()}
        self.actors = [cls.options(runtime_env=env).remote(i, timeout) for i in range(size)]
        self.pids = ray.get([a.set_peers.remote(self.actors) for a in self.actors])
        atexit.register(self.shutdown)

    def call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        ray = self._ray
        if self.broken:
            raise WorkerDied(f"the Ray worker pool is unusable: {self.broken}")
        run_id = next(self._runs)
        refs = [self.actors[i].handle.remote(cmd, sid, run_id, p)
                for i, p in enumerate(payloads)]
        which = {ref: i for i, ref in enumerate(refs)}
        results: dict = {}
        first_error: Optional[BaseException] = None
        pending = list(refs)
        told_finished: set = set()
        while pending:
            # Wait for all, but wake up regularly to notice a failure (or a finished worker
            # that others still wait for in a collective) while the rest are still running.
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL)
            for ref in done:
                i = which[ref]
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self.broken = f"worker {i} (Ray actor, pid {self.pids[i]}) died"
                    if first_error is None:
                        first_error = WorkerDied(f"worker {i} (Ray actor, pid {self.pids[i]}) "
                                                 f"died: {type(e).__name__}")
                        first_error.workers = [i]
                        self._abort(run_id, first_error)
                except ray.exceptions.RayTaskError as e:
                    cause = _cause(e)
                    if first_error is None and not isinstance(cause, RunAborted):
                        first_error = WorkerError(f"worker {i} (Ray actor) failed: "
                                                  f"{type(cause).__name__}: {cause}")
                        self._abort(run_id, first_error)
            if first_error is not None and pending:
                # Give the released workers a moment to answer, then stop waiting.
                ray.wait(pending, num_returns=len(pending), timeout=_ABORT_GRACE)
                break
            for i in set(results) - told_finished:
                told_finished.add(i)
                for j in range(len(refs)):
                    if j not in results:
                        self.actors[j].peer_finished.remote(i, run_id)
        if first_error is not None:
            if self.broken:
                self.shutdown()
            raise first_error
        return [results[i] for i in range(len(refs))]

    def _abort(self, run_id: int, exc: BaseException) -> None:
        for a in self.actors:
            try:
                a.abort.remote(run_id, f"another worker failed: {exc}")
            except Exception:  # noqa: BLE001 - a dead actor cannot be released anyway
                pass

    def shutdown(self) -> None:
        """Kill the actors (and the local Ray this pool started)."""
        if self.closed:
            return
        self.closed = True
        for a in self.actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.started_ray and self._ray.is_initialized():
            self._ray.shutdown()


_POOL: Optional[RayPool] = None


def ray_pool(size: int) -> RayPool:
    """The process-wide Ray pool of `size` workers (recreated after a worker died)."""
    global _POOL
    if _POOL is not None and (_POOL.closed or _POOL.size != size):
        if not _POOL.closed:
            _POOL.shutdown()
        _POOL = None
    if _POOL is None:
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise ImportError("POPXL_BACKEND=ray needs Ray: pip install 'popxl-dist[ray]'") \
                from e
        _POOL = RayPool(size)
    return _POOL
