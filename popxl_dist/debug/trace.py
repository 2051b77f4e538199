"""The profiler's trace file, in the Chrome trace event format (the JSON object form) that
Perfetto (ui.perfetto.dev, offline too) and chrome://tracing open.

Complete events (`"ph": "X"`) carry `ts` and `dur` in microseconds from the job's origin (the
wall-clock time of the first profiled Session, in `otherData.origin_unix_s`), `pid` (0 the
host, w + 1 worker w), `tid` (0 a worker's runs, r + 1 replica r), `name`, `cat` and `args`;
metadata events (`"ph": "M"`) name and order the processes and threads.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, Iterator

if TYPE_CHECKING:
    from .profile_records import JobProfile

__all__ = ["write_trace", "trace_events"]


def _metadata(job: "JobProfile") -> Iterator[Dict]:
    for pid, name in sorted(job.process_names.items()):
        yield {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
        yield {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
               "args": {"sort_index": pid}}
    for (pid, tid), name in sorted(job.thread_names.items()):
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
               "args": {"sort_index": tid}}


def trace_events(job: "JobProfile") -> Iterator[Dict]:
    """Every event of the trace: the metadata, then the slices in the order they were taken."""
    yield from _metadata(job)
    origin = job.origin
    for pid, tid, name, cat, start, end, args in job.events:
        ts = round((start - origin) * 1e6, 3)        # (rounded ends: slices that meet, meet)
        dur = round(max(round((end - origin) * 1e6, 3) - ts, 0.0), 3)
        yield {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
               "tid": tid, "args": args}


def write_trace(job: "JobProfile", path: str) -> None:
    """Write the job's trace to `path`, one event per line (streamed: a long job's trace is
    never held as one string)."""
    other = {"origin_unix_s": job.origin, "sessions": [s.tag for s in job.sessions],
             "producer": "popxl-dist POPXL_PROFILE",
             "events_dropped": job.dropped}
    with open(path, "w") as f:
        f.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other)
                + ', "traceEvents": [\n')
        first = True
        for ev in trace_events(job):
            f.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
            first = False
        f.write("\n]}\n")
