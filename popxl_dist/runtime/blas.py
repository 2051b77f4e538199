"""BLAS threads of the workers: always one, inside the blocks the runtime hands to its threads.

OpenBLAS gives different bits for most matrix products with different thread counts (its
threads split the work and choose other kernels), and a program must give the same bits on
every backend, with any number of workers and threads. So the runtime owns the parallelism
(`engine/parallel.py`: matmuls split into output blocks that depend on the shapes only) and BLAS
runs single-threaded inside every block: `blas_threads()` sets every BLAS library to one thread
while a worker computes, on every backend (the host's own NumPy work outside `Session.run` keeps
the user's settings). The BLAS libraries' own variables (`OPENBLAS_NUM_THREADS`,
`OMP_NUM_THREADS`, ...) no longer change what a worker computes; how many threads a worker uses
is `POPXL_THREADS` (see `runtime/cores.py`).

OpenBLAS takes thread-count changes from a process's main thread only, so the count is set on
the thread that drives the workers: the host's (local and worker-thread backends), each MPI
rank's and Ray actor's own main thread (Ray actors also start with one thread in their BLAS
variables); worker threads nest inside that scope.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import List, Optional

__all__ = ["job_blas_threads", "user_blas_vars", "blas_threads", "BLAS_VARS"]

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def user_blas_vars() -> dict:
    """The BLAS libraries' own thread variables the user set."""
    return {v: os.environ[v] for v in BLAS_VARS if os.environ.get(v, "").strip()}


def job_blas_threads() -> int:
    """The BLAS thread count inside a worker's computation: 1 (the runtime's own threads run the
    blocks in parallel, see `engine/parallel.py`)."""
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
                if self._n:
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
            if self._depth == 0 and self._n:
                for lib, cur in zip(self._controllers(), self._saved):
                    if cur != self._n:
                        lib.set_num_threads(cur)
        return False

    def current(self) -> List[int]:
        """The thread count of each BLAS library now (for tests and reports)."""
        return [lib.get_num_threads() for lib in self._controllers()]


_LIMITER = _Limiter()


def blas_threads() -> _Limiter:
    """`with blas_threads(): ...`: run a worker's computation with one BLAS thread."""
    return _LIMITER
