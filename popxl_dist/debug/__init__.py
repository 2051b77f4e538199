"""See inside every replica (popxl-dist extensions; nothing here exists upstream).

* `capture(session, tensors)`: read intermediate tensors of every replica, no program change.
* `save_replay(session)`: write the bundle of the latest run (with `POPXL_RECORD=DIR`);
  `replay(path)` / the `popxl-replay` command run a bundle again in one process.
* Environment switches read when a Session is created: `POPXL_DEBUG_NANS=1` (the first op that
  makes a NaN or infinity raises `popxl.errors.NonFiniteError`), `POPXL_CHECK_REPLICAS=1`
  (replicas that should agree are compared after each run:
  `popxl.errors.ReplicaDivergenceError`), `POPXL_RECORD=DIR`, `POPXL_FLIGHT_RECORDER=DIR`,
  `POPXL_PROFILE=DIR` (a trace of every op on every replica and a table; `write_profile()`
  writes them before the process exits).
"""
from typing import Optional

from .capture import TapCall, capture
from .replay import ReplayResult, load_bundle, replay, save_replay

__all__ = ["capture", "TapCall", "save_replay", "replay", "load_bundle", "ReplayResult",
           "write_profile"]


def write_profile(print_table: bool = False) -> Optional[str]:
    """With `POPXL_PROFILE=DIR`: write the trace and table of the Sessions profiled so far now
    (instead of at exit) and return the trace's path; Sessions created later start a new trace.
    None when nothing was profiled. (popxl-dist extension; see docs/profiling.md.)"""
    from . import profile

    job = profile.current_job()
    return profile.finish(job, print_table=print_table) if job is not None else None
