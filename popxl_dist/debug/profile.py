"""The host side of the profiler (`POPXL_PROFILE=DIR`, `popxl-run --profile DIR`).

Every Session created while `POPXL_PROFILE` is set runs a profiled program on its workers (see
`engine/profiler.py`) behind a `ProfiledRuntime`, which times the host's requests (runs, weight
transfers) and, after each run, takes every worker's records. The job's `JobProfile` turns them
into trace events on one time axis (wall-clock seconds, see the worker profiler) and into the
totals of the printed table; when the process exits it writes
`DIR/popxl-trace-<host>-<pid>.json` (the Chrome trace event format: Perfetto, chrome://tracing)
and `DIR/popxl-profile-<host>-<pid>.txt` (the table, also printed to stderr).

Tracks: process 0 is the host (the script), process w + 1 is worker w; in a worker, thread 0
carries its runs and thread r + 1 replica r's ops. A collective's slice spans from its replica's
arrival to the end of the exchange, split into "wait for peers" (until the last worker holding
a member of the replica's group had all its replicas there) and "transfer" (moving, reducing and
copying the data).
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import Optional

from .._ir.records import IrData
from .profile_records import MAX_EVENTS, TRANSFER, WAIT, JobProfile, SessionProfile, Totals
from .profile_table import profile_table
from .trace import write_trace

__all__ = ["ProfiledRuntime", "JobProfile", "SessionProfile", "Totals", "job_profile",
           "current_job", "finish", "MAX_EVENTS", "WAIT", "TRANSFER"]


def finish(job: JobProfile, print_table: bool = True) -> Optional[str]:
    """Write `job`'s trace and table (once; at exit) and print the table to stderr."""
    if job.written is not None or not job.sessions:
        return job.written
    for sp in job.sessions:
        sp.flush()
    os.makedirs(job.out_dir, exist_ok=True)
    write_trace(job, job.trace_path)
    text = profile_table(job)
    with open(job.table_path, "w") as f:
        f.write(text)
    if print_table:
        sys.stderr.write(text)
        sys.stderr.flush()
    job.written = job.trace_path
    return job.written


_JOB: Optional[JobProfile] = None


def job_profile(out_dir: str) -> JobProfile:
    """This process's JobProfile (made by the first profiled Session, written at exit)."""
    global _JOB
    if _JOB is None or _JOB.written is not None:
        _JOB = JobProfile(out_dir)
        atexit.register(finish, _JOB)
    return _JOB


def current_job() -> Optional[JobProfile]:
    """The JobProfile collecting now (None before the first profiled Session)."""
    return _JOB if _JOB is not None and _JOB.written is None else None


def _inner(runtime):
    return getattr(runtime, "_inner", runtime)


def _nbytes(arrays) -> int:
    return int(sum(getattr(a, "nbytes", 0) for a in arrays))


class ProfiledRuntime:
    """A Session's runtime with the profiler on: every request is timed on the host track, and
    the workers' records are taken after each run. Everything else is the runtime's own."""

    def __init__(self, inner, ir: IrData):
        self._inner = inner
        self._profile = job_profile(ir.debug.profile_dir).session(ir, inner.name,
                                                                  inner.blocks())

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _collect(self) -> None:
        self._profile.add(self._inner.take_profile())

    def run(self, inputs, outputs) -> None:
        with self._profile.host("Session.run", bytes_in=_nbytes(inputs),
                                bytes_out=_nbytes(outputs)):
            self._inner.run(inputs, outputs)
        self._collect()

    def run_fragment(self, which: str) -> None:
        with self._profile.host(which):
            self._inner.run_fragment(which)
        self._collect()

    def read_variables(self, tids):
        with self._profile.host("read variables", variables=len(tids)):
            values = self._inner.read_variables(tids)
        return values

    def write_variables(self, values) -> None:
        with self._profile.host("write variables", variables=len(values),
                                bytes=_nbytes(values.values())):
            self._inner.write_variables(values)

    def shares_workers_with(self, other) -> bool:
        return self._inner.shares_workers_with(_inner(other))

    def copy_to(self, other, plans) -> None:
        with self._profile.host("copy variables on the workers"):
            self._inner.copy_to(_inner(other), plans)
