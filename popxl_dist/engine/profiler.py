"""The worker side of the profiler (`POPXL_PROFILE=DIR`): when each op ran on each replica.

A profiled program (see `engine/instrument.py`) brackets every op statement with clock reads and
appends `(op id, start, end)` to its replica's `ctx.prof`; before a collective it appends
`(op id, arrival, None)`. The executor records each collective step (the moment every local
replica had arrived, and the end) with `step`. Nothing else changes: the same kernels, memory
plan and batched collectives run, so the bits are the same as without profiling.

Clock: `time.perf_counter()` (monotonic, ~40 ns a read) plus this worker's offset to the wall
clock (`time.time()`), measured once when the profiler is made. The host converts every record
to wall-clock time, so the workers of a job (threads, MPI ranks, Ray actors, other hosts with
synchronised clocks) share one time axis.

The host takes the records after every run (`take`): op descriptions stay on the host, which has
the same Ir; only numbers travel.
"""
from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from time import perf_counter
from typing import Dict, Iterator, List, Sequence

__all__ = ["WorkerProfiler", "RUN", "clock"]

clock = perf_counter
RUN = "run"     # the kind of a Session.run; fragments are named by their graph


class WorkerProfiler:
    """Run records of one worker, kept until the host takes them.

    Args:
        worker: the worker's index in the Session's layout.
        replicas: its replicas (global indices), in order.
    """

    def __init__(self, worker: int, replicas: Sequence[int]):
        self.worker = worker
        self.replicas = list(replicas)
        self.offset = time.time() - perf_counter()
        self.where = {"host": socket.gethostname(), "pid": os.getpid()}
        self.records: List[dict] = []
        self._steps: List[tuple] = []

    @contextmanager
    def running(self, kind: str, run: int, ctxs) -> Iterator[None]:
        """Record one execution of a graph (a run, or a weights fragment) on every replica."""
        for ctx in ctxs:
            ctx.prof = []
        self._steps = []
        start = perf_counter()
        try:
            yield
        finally:
            end = perf_counter()
            self.records.append({"kind": kind, "run": run, "start": start, "end": end,
                                 "ops": {ctx.replica: ctx.prof for ctx in ctxs},
                                 "steps": self._steps})
            for ctx in ctxs:
                ctx.prof = []

    def step(self, ops, start: float) -> None:
        """A collective step that began at `start` (every local replica had arrived) ends
        now; `ops` are the collective ops it ran (several for a batched step)."""
        self._steps.append((tuple(op.id for op in ops), start, perf_counter()))

    def take(self) -> Dict:
        """The records since the last take (and forget them), with this worker's clock offset
        and where it runs."""
        records, self.records = self.records, []
        return {"worker": self.worker, "replicas": self.replicas, "offset": self.offset,
                "where": self.where, "records": records}
