"""The profiler's records on the host: each Session's trace events and totals
(`SessionProfile`) and the process's collection of them (`JobProfile`); `profile.py` writes
them out (`trace.py`, `profile_table.py`)."""
from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .._ir.records import IrData
from ..engine.comm import group_of, members
from .op_info import OpInfo, describe_ops

__all__ = ["JobProfile", "SessionProfile", "Totals", "OpTotals", "MAX_EVENTS", "WAIT",
           "TRANSFER"]

MAX_EVENTS = 2_000_000      # trace events kept; later runs still count in the table
WAIT = "wait for peers"
TRANSFER = "transfer"

# An event: (pid, tid, name, category, start s, end s, args dict)
Event = Tuple[int, int, str, str, float, float, dict]


class OpTotals:
    """Calls and seconds of one op (or one batched collective step) over all runs and
    replicas."""

    __slots__ = ("calls", "total", "self_time", "wait")

    def __init__(self):
        self.calls = 0
        self.total = 0.0
        self.self_time = 0.0
        self.wait = 0.0


class Totals:
    """The table's sums over a set of runs."""

    def __init__(self):
        self.ops: Dict[Tuple[int, ...], OpTotals] = {}     # by op id (ids of a batched step)
        # replica -> [collective steps, seconds in collectives, waiting, transferring]
        self.collectives: Dict[int, List[float]] = {}
        self.run_time: Dict[int, float] = {}     # replica -> seconds of its runs
        self.runs = 0


class SessionProfile:
    """What one Session's runs took: trace events (kept by the job) and totals for the table."""

    def __init__(self, job: "JobProfile", ir: IrData, backend: str,
                 blocks: Sequence[Tuple[int, int]]):
        self.job = job
        self.tag = ir.debug.session_tag
        self.backend = backend
        self.ops: Dict[int, OpInfo] = describe_ops(ir)
        self.blocks = list(blocks)
        self.replication_factor = ir.replication_factor
        # The table sums the runs after the first (compilation of numba loops, first
        # allocations and first-touch page faults happen in the first) and the first apart;
        # weight fragments are in the trace only.
        self.first = Totals()
        self.steady = Totals()
        self._owner = [w for w, (a, b) in enumerate(self.blocks) for _ in range(a, b)]
        self._group_workers: Dict[Tuple[int, Tuple[int, int]], Tuple[int, ...]] = {}
        self._pending: List[Sequence[dict]] = []

    # --- host side ---------------------------------------------------------------------
    @contextmanager
    def host(self, name: str, **args) -> Iterator[None]:
        """A host-track slice around a request to the workers."""
        start = time.time()
        try:
            yield
        finally:
            self.job.add(0, 0, name, "host", start, time.time(), dict(args, session=self.tag))

    # --- worker records ----------------------------------------------------------------
    def add(self, parts: Sequence[dict]) -> None:
        """Keep the records of every worker (`WorkerProfiler.take()` of each) of the requests
        since the last call; they become trace events and totals in `flush` (when the trace
        is written), so that the host's work between runs stays small."""
        self._pending.append(parts)

    def flush(self) -> None:
        """Turn the records kept so far into trace events and totals."""
        pending, self._pending = self._pending, []
        for parts in pending:
            self._add_parts(parts)

    def _add_parts(self, parts: Sequence[dict]) -> None:
        executions: Dict[Tuple, Dict[int, Tuple[dict, float]]] = {}
        for part in parts:
            self.job.name_worker(part, self.backend)
            seen: Dict[Tuple[str, int], int] = {}
            for rec in part["records"]:
                key = (rec["kind"], rec["run"])
                n = seen[key] = seen.get(key, -1) + 1
                executions.setdefault(key + (n,), {})[part["worker"]] = (rec, part["offset"])
        for (kind, run, _), by_worker in executions.items():
            totals = None if kind != "run" else self.first if run == 1 else self.steady
            if totals is not None:
                totals.runs += 1
            self._add_execution(kind, run, by_worker, totals)

    def _add_execution(self, kind: str, run: int, by_worker: Dict[int, Tuple[dict, float]],
                       totals: Optional[Totals]) -> None:
        starts = {w: [s + off for _, s, _ in rec["steps"]] for w, (rec, off) in by_worker.items()}
        for w, (rec, off) in by_worker.items():
            name = f"run {run}" if kind == "run" else kind
            self.job.add(w + 1, 0, name, "run", rec["start"] + off, rec["end"] + off,
                         {"session": self.tag, "run": run})
            for replica, evs in rec["ops"].items():
                if totals is not None:
                    totals.run_time[replica] = (totals.run_time.get(replica, 0.0)
                                                + rec["end"] - rec["start"])
                self._add_replica(w, replica, evs, rec["steps"], off, starts,
                                  totals if totals is not None else Totals())

    def _add_replica(self, w: int, replica: int, evs: List[tuple], steps: List[tuple],
                     off: float, starts: Dict[int, List[float]], sums: Totals) -> None:
        pid, tid = w + 1, replica + 1
        slices: List[Tuple[float, float, Tuple[int, ...], Optional[Tuple[float, float]]]] = []
        k = 0
        for op_id, t0, t1 in evs:
            if t1 is not None:
                slices.append((t0 + off, t1 + off, (op_id,), None))
                continue
            if k >= len(steps):         # (a run that failed in this collective)
                continue
            ids, s, e = steps[k]
            ready = self._ready(replica, ids[0], k, starts, s + off, e + off)
            slices.append((t0 + off, e + off, ids, (ready, e + off)))
            k += 1
        slices.sort(key=lambda x: (x[0], -x[1]))
        stack: List[Tuple[float, OpTotals]] = []       # (end, totals) of open slices
        for start, end, ids, split in slices:
            while stack and stack[-1][0] <= start:
                stack.pop()
            totals = sums.ops.get(ids)
            if totals is None:
                totals = sums.ops[ids] = OpTotals()
            dur = end - start
            totals.calls += 1
            totals.total += dur
            totals.self_time += dur
            if stack:
                stack[-1][1].self_time -= dur
            stack.append((end, totals))
            info = self.ops.get(ids[0])
            name = info.type if info else f"op {ids[0]}"
            args = info.args() if info else {}
            if split is None:
                self.job.add(pid, tid, name, info.category if info else "op", start, end, args)
                continue
            ready, e = split
            wait = ready - start
            totals.wait += wait
            c = sums.collectives.setdefault(replica, [0, 0.0, 0.0, 0.0])
            c[0] += 1
            c[1] += dur
            c[2] += wait
            c[3] += e - ready
            if len(ids) > 1:
                name = f"{name} x{len(ids)} (batched)"
                args = dict(args, batched=[self.ops[i].label for i in ids if i in self.ops])
            args = dict(args, wait_us=round(wait * 1e6, 3), transfer_us=round((e - ready) * 1e6, 3))
            self.job.add(pid, tid, name, "collective", start, end, args)
            self.job.add(pid, tid, WAIT, "collective.wait", start, ready, {})
            self.job.add(pid, tid, TRANSFER, "collective.transfer", ready, e, {})

    def _ready(self, replica: int, op_id: int, k: int, starts: Dict[int, List[float]],
               s: float, e: float) -> float:
        """When the data of every member of `replica`'s group could be exchanged in step k: the
        latest step start of the workers holding them (within this worker's own step)."""
        info = self.ops.get(op_id)
        group = info.group if info is not None and info.group else (1, self.replication_factor)
        key = (replica, group)
        workers = self._group_workers.get(key)
        if workers is None:
            stride, size = group
            mem = members(group_of(replica, stride, size), stride, size)
            workers = self._group_workers[key] = tuple(sorted({self._owner[m] for m in mem
                                                               if m < len(self._owner)}))
        latest = max((starts[w][k] for w in workers if w in starts and k < len(starts[w])),
                     default=s)
        return min(max(latest, s), e)


class JobProfile:
    """All profiled Sessions of this process; writes the trace and the table at exit."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.origin = time.time()
        self.events: List[Event] = []
        self.dropped = 0
        self.sessions: List[SessionProfile] = []
        self.process_names: Dict[int, str] = {
            0: f"host (script, pid {os.getpid()} on {socket.gethostname()})"}
        self.thread_names: Dict[Tuple[int, int], str] = {(0, 0): "Session requests"}
        self.written: Optional[str] = None
        self._lock = threading.Lock()
        stem = f"{socket.gethostname()}-{os.getpid()}"
        self.trace_path = os.path.join(out_dir, f"popxl-trace-{stem}.json")
        self.table_path = os.path.join(out_dir, f"popxl-profile-{stem}.txt")

    def session(self, ir: IrData, backend: str, blocks: Sequence[Tuple[int, int]]
                ) -> SessionProfile:
        sp = SessionProfile(self, ir, backend, blocks)
        self.sessions.append(sp)
        return sp

    def name_worker(self, part: dict, backend: str) -> None:
        """Name the tracks of the worker whose records `part` holds."""
        pid = part["worker"] + 1
        self.thread_names.setdefault((pid, 0), "runs")
        for r in part["replicas"]:
            self.thread_names.setdefault((pid, r + 1), f"replica {r}")
        if pid not in self.process_names:
            where = part.get("where", {})
            self.process_names[pid] = (f"worker {part['worker']} ({backend}, pid "
                                       f"{where.get('pid', '?')} on {where.get('host', '?')})")

    def add(self, pid: int, tid: int, name: str, cat: str, start: float, end: float,
            args: dict) -> None:
        with self._lock:
            if len(self.events) >= MAX_EVENTS:
                self.dropped += 1
                return
            self.events.append((pid, tid, name, cat, start, end, args))
