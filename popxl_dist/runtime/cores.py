"""One budget of cores per machine: how many threads a worker computes with.

A worker (the local backend's process or worker thread, an MPI rank, a Ray actor, a popdist
instance) gets the machine's cores divided among the workers on that machine:
`worker_threads(workers)`. The worker divides its share among the replicas it runs at once
(`engine.executor.replica_threads`), and each replica computes with what is left over as
intra-op threads (`engine.parallel`). Results never depend on any of these counts (see
`engine/parallel.py`), so every process may choose its own.

* `POPXL_THREADS=N` sets the threads of every worker (the same in every process of the job:
  Ray actors receive it).
* `POPXL_BLAS_THREADS=N` is its deprecated former name: honoured as `POPXL_THREADS` (when that
  is unset), with a warning. BLAS itself now always runs one thread inside the blocks the
  runtime hands out (`runtime/blas.py`).
* Otherwise: the cores this process may run on (its CPU affinity) divided by the workers on
  the machine: `MPI_LOCALNRANKS` (MPICH's hydra) or `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI) for
  MPI ranks, the workers a backend placed on this node where it knows them (Ray), else all the
  job's workers.
"""
from __future__ import annotations

import os
import warnings
from typing import Optional

from .env import positive_int

__all__ = ["machine_cores", "workers_on_machine", "worker_threads", "explicit_threads",
           "set_local_workers", "DEPRECATED_THREADS_VAR"]

DEPRECATED_THREADS_VAR = "POPXL_BLAS_THREADS"

_STATE = {"local_workers": None, "warned": False}


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity; all CPUs where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:                      # macOS
        return os.cpu_count() or 1


def set_local_workers(n: Optional[int]) -> None:
    """Tell the budget how many of the job's workers share this machine (a backend that
    placed them says so: Ray's workers of this node); None forgets it."""
    _STATE["local_workers"] = None if n is None else max(1, int(n))


def workers_on_machine(workers: int) -> int:
    """How many workers share this machine's cores, out of the job's `workers`."""
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if local and local.strip().isdigit() and int(local) > 0:
        return int(local)
    hint = _STATE["local_workers"]
    if hint is not None:
        return min(hint, max(workers, 1))
    return max(workers, 1)


def explicit_threads() -> Optional[int]:
    """`POPXL_THREADS`, else the deprecated `POPXL_BLAS_THREADS` (with a warning), else None."""
    n = positive_int("POPXL_THREADS")
    if n is not None:
        return n
    n = positive_int(DEPRECATED_THREADS_VAR)
    if n is not None and not _STATE["warned"]:
        _STATE["warned"] = True
        warnings.warn(
            f"{DEPRECATED_THREADS_VAR} is deprecated: set POPXL_THREADS={n} (threads per "
            f"worker) instead. BLAS now runs one thread inside the blocks popxl-dist hands to "
            f"its threads, so results no longer depend on the thread count.",
            FutureWarning, stacklevel=3)
    return n


def worker_threads(workers: int = 1) -> int:
    """The threads one worker computes with: `POPXL_THREADS`, else its share of the machine's
    cores (at least 1)."""
    n = explicit_threads()
    if n is not None:
        return n
    return max(1, machine_cores() // workers_on_machine(workers))
