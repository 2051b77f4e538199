"""Several workers as threads of the calling process (the `local` backend with POPXL_WORKERS > 1).

Each thread is a worker with its own block of replicas; collectives go through in-process
mailboxes. This exercises exactly the code paths of the MPI and Ray backends (blocks, partial
reductions, exchange) without starting a process.
"""
from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, List, Optional, Sequence

from ...errors import CollectiveTimeout, RunAborted, WorkerError
from ..blas import blas_threads
from ..env import collective_timeout
from ..transport.mailbox import Mailbox, MailboxTransport
from ..transport.reported import flight_of, with_flights
from .pool import WorkerPool
from .service import WorkerService

__all__ = ["ThreadPool", "thread_pool"]

_STUCK_GRACE = 0.25    # seconds a released worker thread gets to return after a timeout


class ThreadPool(WorkerPool):
    name = "local"
    broken: Optional[str] = None     # set when the pool is retired

    def __init__(self, size: int):
        self.size = size
        self.mailboxes = [Mailbox() for _ in range(size)]
        timeout = collective_timeout()

        def deliver(peer, src, run_id, tag, arr):
            self.mailboxes[peer].put(src, run_id, tag, arr.copy())

        self.services = []
        for i in range(size):
            transport = MailboxTransport(i, self.mailboxes[i], deliver, timeout)
            self.services.append(WorkerService(i, transport, transport.start_run))
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="popxl-worker")

    def close_session(self, sid: int) -> None:
        for service in self.services:
            service.sessions.pop(sid, None)

    def call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        # The BLAS count is set here, on the calling thread, for the worker threads: OpenBLAS
        # takes thread-count changes from the process's main thread only (runtime/blas.py).
        with blas_threads():
            return self._call(sid, cmd, payloads)

    def _call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        if self.broken:
            raise WorkerError(f"the local worker-thread pool is unusable: {self.broken}")
        run_id = next(self._runs)
        if len(payloads) == 1:
            return [self.services[0].handle(cmd, sid, run_id, payloads[0])]
        def settle(i: int, exc: Optional[BaseException]) -> None:
            # Called as each worker ends: release the others at once if it failed, and tell
            # them it finished (anyone still waiting for its data has diverged).
            if exc is None:
                for mb in self.mailboxes:
                    mb.peer_finished(i, run_id)
            elif not isinstance(exc, RunAborted):
                for mb in self.mailboxes:
                    mb.abort(run_id, f"worker {i} failed: {exc}")

        futures = []
        for i in range(1, len(payloads)):
            f = self._executor.submit(self.services[i].handle, cmd, sid, run_id, payloads[i])
            f.add_done_callback(lambda f, i=i: settle(i, f.exception()))
            futures.append(f)
        first: Any = None
        failures: List[BaseException] = []
        try:
            first = self.services[0].handle(cmd, sid, run_id, payloads[0])
            settle(0, None)
        except BaseException as e:  # noqa: BLE001 - re-raised below after the others stop
            settle(0, e)
            failures.append(e)
        self._wait(futures, failures)
        # (Read the futures themselves: their callbacks may still be running.)
        failures += [f.exception() for f in futures if f.done() and f.exception() is not None]
        if failures:
            real = [e for e in failures if not isinstance(e, RunAborted)]
            first = (real or failures)[0]
            raise with_flights(first, [flight_of(e) for e in failures if e is not first])
        return [first] + [f.result() for f in futures]

    def _wait(self, futures, failures: List[BaseException]) -> None:
        """Wait for every worker thread, except after a collective timed out: a thread that
        is still busy then (the silent one) is not waited for; this pool is retired (new
        Sessions get a new one) and the timeout is raised at once."""
        seen, pending = list(failures), set(futures)
        while pending:
            if any(isinstance(e, CollectiveTimeout) for e in seen):
                _, pending = wait(pending, timeout=_STUCK_GRACE)
                if pending:
                    self.broken = "a worker thread was still busy after a collective timed out"
                    if _POOLS.get(self.size) is self:
                        del _POOLS[self.size]
                return
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            seen += [f.exception() for f in done if f.exception() is not None]


_POOLS: dict = {}


def thread_pool(size: int) -> ThreadPool:
    """The process-wide pool of `size` worker threads (shared by every Session)."""
    pool = _POOLS.get(size)
    if pool is None:
        pool = _POOLS[size] = ThreadPool(size)
    return pool
