"""Deterministic intra-op parallelism: blocks fixed by the shapes, threads that only run them.

A kernel that splits its work calls `run_blocks(n, fn)`: `fn(0)`, ..., `fn(n - 1)` each run
exactly once, on the calling thread and on helper threads, and the call returns when all have.
The kernel chooses the blocks from the shapes alone (never from the thread count), and each
block writes its own part of the output with the same NumPy / BLAS / compiled-loop calls
whichever thread runs it, so 1 thread and 16 give the same bits (BLAS runs one thread inside
a block: `runtime/blas.py`).

How many threads a caller uses is a property of the calling thread (`threads(n)`, set by the
executor for each replica it runs: `engine/executor.py`); helper threads come from one pool
per process, created on first use and sleeping (not spinning) while idle. Blocks are claimed
in index order by whichever thread is free; a block that raises is re-raised in the caller
(the lowest failing block's exception), after every claimed block has finished. With
floating-point checks on (`SessionOptions.enableFloatingPointChecks`) the blocks run on the
calling thread, where NumPy's error state raises and names the op.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from typing import Callable, Iterator, List, Tuple

import numpy as np

from .kernels._util import fp_checks_on

__all__ = ["run_blocks", "threads", "current_threads"]

_TLS = threading.local()


def current_threads() -> int:
    """The threads the calling thread computes its ops with (1: no helpers)."""
    return getattr(_TLS, "threads", 1)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the ops of this thread with `n` threads (this one and n - 1 helpers)."""
    prev = getattr(_TLS, "threads", 1)
    _TLS.threads = max(1, int(n))
    try:
        yield
    finally:
        _TLS.threads = prev


class _Job:
    """One `run_blocks` call: blocks are claimed with `next(claim)` (atomic in CPython) and
    counted with `next(done)`; whoever finishes the last block releases `finished`."""

    __slots__ = ("fn", "n", "claim", "done", "finished", "errors", "errstate")

    def __init__(self, fn: Callable[[int], None], n: int):
        self.fn = fn
        self.n = n
        self.claim = itertools.count()
        self.done = itertools.count()
        self.finished = threading.Lock()
        self.finished.acquire()
        self.errors: List[Tuple[int, BaseException]] = []
        self.errstate = np.geterr()

    def work(self) -> None:
        fn, n, claim, done, errors = self.fn, self.n, self.claim, self.done, self.errors
        while True:
            i = next(claim)
            if i >= n:
                return
            if not errors:                      # after a failure the rest is skipped
                try:
                    fn(i)
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                    errors.append((i, e))
            if next(done) == n - 1:
                self.finished.release()


class _Pool:
    """The process's helper threads: each takes a ticket (a job) and works on it until the
    job has no unclaimed block. A caller asking for k helpers puts k tickets; the pool keeps
    at least as many threads as the tickets its callers want at once."""

    def __init__(self):
        self.tickets: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.size = 0
        self.wanted = 0

    def acquire(self, k: int) -> None:
        with self.lock:
            self.wanted += k
            while self.size < self.wanted:
                t = threading.Thread(target=self._serve, name=f"popxl-op-{self.size}",
                                     daemon=True)
                t.start()
                self.size += 1

    def release(self, k: int) -> None:
        with self.lock:
            self.wanted -= k

    def _serve(self) -> None:
        tickets = self.tickets
        mine = np.geterr()
        while True:
            job = tickets.get()
            if job.errstate != mine:
                np.seterr(**job.errstate)
                mine = job.errstate
            job.work()


_POOL = _Pool()


def _after_fork() -> None:
    global _POOL
    _POOL = _Pool()                 # a forked child has none of the parent's threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def run_blocks(n: int, fn: Callable[[int], None]) -> None:
    """`fn(i)` for every block i in range(n), on this thread and its helpers (see the module
    docstring); returns when every block has run."""
    t = getattr(_TLS, "threads", 1)
    if n <= 1 or t <= 1 or fp_checks_on():
        for i in range(n):
            fn(i)
        return
    job = _Job(fn, n)
    k = min(t, n) - 1
    pool = _POOL
    pool.acquire(k)
    try:
        for _ in range(k):
            pool.tickets.put(job)
        job.work()
        job.finished.acquire()
    finally:
        pool.release(k)
    if job.errors:
        raise min(job.errors, key=lambda e: e[0])[1]
