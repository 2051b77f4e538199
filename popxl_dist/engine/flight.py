"""The flight recorder: every worker keeps the last collectives of each of its replicas (op,
the line that built it, group, shape, dtype, sequence number in the run, start and end), so a
hang or a divergence can say which replica stopped where and which collective the others were
waiting in. Always on (an append per collective step); dumped as JSON when a run fails and
`POPXL_FLIGHT_RECORDER=DIR` is set, and summarised in timeout and divergence errors.

A record is a plain dict (it pickles and travels to the host with a worker's failure):
`{"replica", "worker", "run", "seq", "op", "type", "source", "group", "shape", "dtype",
"start", "end"}`; `end` is None while the collective waits. Times are `time.time()` seconds.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Sequence

from .._ir.records import Op

__all__ = ["FlightRecorder", "summarise", "dump", "attach", "merge_peers"]


class FlightRecorder:
    """The last `size` collectives of each of a worker's replicas."""

    def __init__(self, worker: int, replicas: Sequence[int], size: int):
        self.worker = worker
        self.rings: Dict[int, Deque[dict]] = {r: deque(maxlen=size) for r in replicas}
        self.seq: Dict[int, int] = dict.fromkeys(replicas, 0)
        self.run = 0
        self.finished: Dict[int, bool] = dict.fromkeys(replicas, False)

    def new_run(self, run: int) -> None:
        self.run = run
        for r in self.seq:
            self.seq[r] = 0
            self.finished[r] = False

    def start(self, replica: int, op: Op, inputs: Sequence) -> list:
        """Record that `replica` entered collective `op` (with its input arrays). Kept as a
        list (cheap on every collective); `snapshot` makes the dicts."""
        seq = self.seq[replica] = self.seq[replica] + 1
        first = inputs[0] if inputs else None
        record = [op, self.run, seq, time.time(), None, getattr(first, "shape", ()),
                  getattr(first, "dtype", "")]
        self.rings[replica].append(record)
        return record

    @staticmethod
    def end(records: Iterable[list]) -> None:
        now = time.time()
        for rec in records:
            rec[4] = now

    def finish(self, replica: int) -> None:
        """`replica` ran to the end of the run."""
        self.finished[replica] = True

    def snapshot(self) -> Dict[int, dict]:
        """`{replica: {"records": [record dicts], "finished": bool}}`."""
        return {r: {"records": [self._as_dict(r, rec) for rec in ring],
                    "finished": self.finished[r]}
                for r, ring in self.rings.items()}

    def _as_dict(self, replica: int, rec: list) -> dict:
        op, run, seq, start, end, shape, dtype = rec
        return {"replica": replica, "worker": self.worker, "run": run, "seq": seq,
                "op": f"{op.type}.{op.id} '{op.name}'", "type": op.type, "source": op.debug,
                "group": {k: op.attrs[k] for k in ("stride", "group_size", "op")
                          if k in op.attrs},
                "shape": [int(d) for d in shape], "dtype": str(dtype), "start": start,
                "end": end}


def _entry(rec: dict, seq: bool = True) -> str:
    where = f" (built at {rec['source']})" if rec.get("source") else ""
    return f"{'#' + str(rec['seq']) + ' ' if seq else ''}{rec['op']}{where}"


def summarise(snapshots: Dict[int, dict], now: Optional[float] = None) -> str:
    """Where each replica was, from workers' snapshots (`{replica: snapshot entry}`), and what
    that means: a replica in another collective, one that finished, one that stopped."""
    now = time.time() if now is None else now
    lines: List[str] = []
    pending: Dict[int, dict] = {}
    last_done: Dict[int, int] = {}
    for r in sorted(snapshots):
        snap = snapshots[r]
        recs = [rec for rec in snap.get("records", ()) if rec["run"] == max(
            (x["run"] for x in snap.get("records", ())), default=0)]
        done = [rec for rec in recs if rec["end"] is not None]
        waiting = [rec for rec in recs if rec["end"] is None]
        last_done[r] = done[-1]["seq"] if done else 0
        worker = recs[-1]["worker"] if recs else "?"
        before = f"; before it: {_entry(done[-1])}" if done else ""
        if waiting:
            pending[r] = waiting[-1]
            lines.append(f"replica {r} (worker {worker}): waiting in {_entry(waiting[-1])} for "
                         f"{now - waiting[-1]['start']:.1f} s{before}")
        elif snap.get("finished"):
            lines.append(f"replica {r} (worker {worker}): finished the run after "
                         f"{last_done[r]} collective(s){before.replace('; before it', '; last')}")
        else:
            lines.append(f"replica {r} (worker {worker}): not in a collective (computing, "
                         f"stopped or hung) after {last_done[r]} collective(s)"
                         f"{before.replace('; before it', '; last')}")
    verdict = _verdict(snapshots, pending, last_done)
    return "\n  ".join(["flight recorder (last collectives of each replica):"] + lines
                       + ([verdict] if verdict else []))


def _verdict(snapshots: Dict[int, dict], pending: Dict[int, dict],
             last_done: Dict[int, int]) -> str:
    if not pending:
        return ""
    by_seq: Dict[int, Dict[str, List[int]]] = {}
    for r, rec in pending.items():
        by_seq.setdefault(rec["seq"], {}).setdefault(_entry(rec, seq=False), []).append(r)
    for seq, ops in sorted(by_seq.items()):
        if len(ops) > 1:
            parts = "; ".join(f"replica{'s' if len(rs) > 1 else ''} "
                              f"{', '.join(map(str, rs))} in {e}" for e, rs in ops.items())
            return f"=> the replicas diverged at collective #{seq}: {parts}"
    waiting_at = min(rec["seq"] for rec in pending.values())
    behind = [r for r in snapshots if r not in pending and last_done.get(r, 0) < waiting_at]
    if behind:
        what = ", ".join(map(str, behind))
        rec = next(iter(pending.values()))
        return (f"=> replica{'s' if len(behind) > 1 else ''} {what} never reached collective "
                f"#{waiting_at} ({_entry(rec)}), which the others wait in")
    return ""


def dump(directory: str, tag: str, worker: int, snapshot: Dict[int, dict], reason: str) -> str:
    """Write one worker's snapshot as JSON under `directory`; returns the file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"flight-{tag}-worker{worker}-pid{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump({"worker": worker, "reason": reason, "time": time.time(),
                   "replicas": {str(r): s for r, s in snapshot.items()}}, f, indent=1)
    return path


def attach(err: BaseException, snapshot: Dict[int, dict]) -> BaseException:
    """Give `err` the flight records of these replicas (`err.flight`) and end its message with
    their summary; `merge_peers` adds other workers' records later."""
    if getattr(err, "flight", None) is not None:
        return err
    err.flight = dict(snapshot)
    err.flight_base = str(err.args[0]) if err.args else ""
    _resummarise(err)
    return err


def merge_peers(err: BaseException, snapshots: Iterable[Dict[int, dict]]) -> BaseException:
    """Add other workers' flight records to `err` (one that `attach` gave its own)."""
    flight = getattr(err, "flight", None)
    if flight is None:
        return err
    added = False
    for snap in snapshots:
        for r, s in (snap or {}).items():
            if r not in flight:
                flight[r] = s
                added = True
    if added:
        _resummarise(err)
    return err


def _resummarise(err: BaseException) -> None:
    err.args = (f"{err.flight_base}\n  {summarise(err.flight)}",) + tuple(err.args[1:])
