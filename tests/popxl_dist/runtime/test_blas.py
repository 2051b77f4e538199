"""BLAS threads: always one inside a worker's computation (the runtime's own threads run the
blocks: engine/parallel.py), set by the runtime around every worker computation whatever the
user's BLAS variables say, the host's own settings restored."""
import threading

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.engine.kernels.registry import KERNELS, kernel
from popxl.ops._builder import Out, add_op
from popxl.runtime import blas
from popxl.runtime.blas import blas_threads, job_blas_threads

threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture
def clean_env(monkeypatch):
    for v in blas.BLAS_VARS + ("POPXL_BLAS_THREADS", "POPXL_THREADS"):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_job_count_is_one_whatever_the_variables_say(clean_env):
    assert job_blas_threads() == 1
    clean_env.setenv("OPENBLAS_NUM_THREADS", "3")
    assert job_blas_threads() == 1                 # no longer changes what workers compute
    clean_env.setenv("POPXL_THREADS", "2")
    assert job_blas_threads() == 1                 # popxl's own threads, not BLAS's


def _blas_counts():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_limiter_sets_and_restores_and_counts_nested_users(clean_env):
    before = _blas_counts()
    assert before
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        with blas_threads():
            assert _blas_counts() == [1] * len(before)
            with blas_threads():                   # a second worker thread of this process
                assert _blas_counts() == [1] * len(before)
            assert _blas_counts() == [1] * len(before)
        assert _blas_counts() == [2] * len(before)


def test_limiter_across_threads(clean_env):
    """Worker threads nest inside the driving thread's scope (OpenBLAS takes the count from the
    main thread), as the worker-thread backend runs them."""
    seen = []

    def worker():
        with blas_threads():
            seen.append(_blas_counts())
        seen.append(_blas_counts())          # the driving thread is still inside

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        with blas_threads():
            t = threading.Thread(target=worker)
            t.start()
            t.join(10)
            assert _blas_counts() and all(c == 1 for c in _blas_counts())
        assert len(seen) == 2 and all(c == 1 for counts in seen for c in counts)
        assert all(c == 2 for c in _blas_counts())


_SEEN = []


def _record_kernel_registered():
    if "TestRecordBlasThreads" not in KERNELS:
        @kernel("TestRecordBlasThreads")
        def _record(attrs, ins, outs):
            def run(x):
                _SEEN.append(_blas_counts())
                return x.copy()
            return run


@pytest.mark.parametrize("workers", ["1", "2"])
def test_session_runs_with_the_job_count_and_restores_the_host(clean_env, workers):
    """local backend with one worker, and with two worker threads (the service path the MPI and
    Ray workers use)."""
    _record_kernel_registered()
    clean_env.setenv("POPXL_WORKERS", workers)
    clean_env.setenv("OPENBLAS_NUM_THREADS", "2")        # the user's: not for the workers
    _SEEN.clear()
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.ones(4, np.float32), name="x")
        y, = add_op("TestRecordBlasThreads", "record", [x], [Out("y", (4,), popxl.float32)])
        s = popxl.d2h_stream((4,), popxl.float32, "y")
        ops.host_store(s, y)
    try:
        with threadpoolctl.threadpool_limits(2, user_api="blas"):
            with popxl.Session(ir, "ipu_hw") as sess:
                sess.run()
            assert _blas_counts() and all(c == 2 for c in _blas_counts())
    finally:
        KERNELS.pop("TestRecordBlasThreads", None)
    assert len(_SEEN) == 2                          # both replicas
    assert all(all(c == 1 for c in counts) for counts in _SEEN)


def test_ray_actor_environment_one_blas_thread_and_the_job_threads(clean_env):
    from popxl.runtime.backends.ray import _actor_env

    env = _actor_env()
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert "POPXL_THREADS" not in env              # each actor: its node's share of the cores
    clean_env.setenv("OMP_NUM_THREADS", "3")
    clean_env.setenv("POPXL_THREADS", "4")
    env = _actor_env()
    assert env["OMP_NUM_THREADS"] == "1" and env["POPXL_THREADS"] == "4"


def test_missing_threadpoolctl_is_said_not_silent(monkeypatch):
    """Without threadpoolctl (an outdated install) the thread count cannot be set, and the
    backends may then disagree in the last bit: a warning says so instead of nothing."""
    import sys
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    limiter = blas._Limiter()
    with pytest.warns(RuntimeWarning, match="threadpoolctl is not installed"):
        assert limiter._controllers() == []
