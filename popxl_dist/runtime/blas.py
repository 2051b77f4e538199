"""BLAS threads of the workers: one count per job, the same in every worker on every backend.

OpenBLAS gives different bits for most matrix products with different thread counts (and for the
same product split into row blocks), and a program must give the same bits on the local, MPI and
Ray backends with any number of workers. So the thread count is a property of the job, not of where
a worker runs: every worker runs its kernels with `job_blas_threads()` BLAS threads, set with
threadpoolctl while it computes (the host's own NumPy work outside `Session.run` keeps the user's
settings):

* `POPXL_BLAS_THREADS=n` sets it for every worker (and is passed on to Ray actors);
* a BLAS library's own variable set by the user (`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`,
  `MKL_NUM_THREADS`, `BLIS_NUM_THREADS`) is respected as it is (every process of the job inherits
  it, so the bits still agree);
* otherwise 1 thread per worker: the cores of a machine are shared by its workers (MPI ranks,
  Ray actors, worker threads: one per core is the recommended layout), and the many small and
  medium products of emulated programs gain little from BLAS threads but lose a lot when several
  processes' BLAS threads share the cores (measured: benchmarks/bench_transformer.py, README
  "Performance").

OpenBLAS takes thread-count changes from a process's main thread only, so the count is set on
the thread that drives the workers: the host's (local and worker-thread backends), each MPI
rank's and Ray actor's own main thread (Ray actors also start with the count in their BLAS
variables); worker threads nest inside that scope.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import List, Optional

from .env import positive_int

__all__ = ["job_blas_threads", "user_blas_vars", "blas_threads", "BLAS_VARS"]

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def user_blas_vars() -> dict:
    """The BLAS libraries' own thread variables the user set."""
    return {v: os.environ[v] for v in BLAS_VARS if os.environ.get(v, "").strip()}


def job_blas_threads() -> Optional[int]:
    """The BLAS thread count of this job's workers, or None to leave BLAS as the user set it."""
    n = positive_int("POPXL_BLAS_THREADS")
    if n is not None:
        return n
    if user_blas_vars():
        return None
    return 1


class _Limiter:
    """Process-wide: the first worker call entering sets the BLAS libraries' thread counts, the
    last one leaving restores them (worker threads of one process share the libraries)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._libs: Optional[list] = None
        self._saved: List[int] = []
        self._n: Optional[int] = None

    def _controllers(self) -> list:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:        # a dependency: a broken or outdated install
                warnings.warn(
                    "popxl-dist: threadpoolctl is not installed, so BLAS threads cannot be set "
                    "per worker: results may differ between backends and runs may be slow. "
                    "Install it (pip install threadpoolctl; it is a dependency of popxl-dist).",
                    RuntimeWarning, stacklevel=2)
                self._libs = []
            else:
                self._libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return self._libs

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                self._n = job_blas_threads()
                if self._n is not None:
                    libs = self._controllers()
                    self._saved = [lib.get_num_threads() for lib in libs]
                    for lib, cur in zip(libs, self._saved):
                        if cur != self._n:
                            lib.set_num_threads(self._n)
            self._depth += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._n is not None:
                for lib, cur in zip(self._controllers(), self._saved):
                    if cur != self._n:
                        lib.set_num_threads(cur)
        return False

    def current(self) -> List[int]:
        """The thread count of each BLAS library now (for tests and reports)."""
        return [lib.get_num_threads() for lib in self._controllers()]


_LIMITER = _Limiter()


def blas_threads() -> _Limiter:
    """`with blas_threads(): ...`: run a worker's computation with the job's BLAS threads."""
    return _LIMITER
