"""One budget of cores per machine: threads per worker from POPXL_THREADS, else the cores divided
among the workers on the machine; the deprecated POPXL_BLAS_THREADS still read, with a warning."""
import warnings

import pytest

from popxl.engine.executor import op_threads, replica_threads
from popxl.runtime import cores
from popxl.runtime.cores import set_local_workers, worker_threads, workers_on_machine


@pytest.fixture
def eight_cores(monkeypatch):
    for v in ("POPXL_THREADS", "POPXL_BLAS_THREADS", "POPXL_REPLICA_THREADS", "MPI_LOCALNRANKS",
              "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setitem(cores._STATE, "local_workers", None)
    monkeypatch.setitem(cores._STATE, "warned", False)
    return monkeypatch


def test_cores_divided_among_the_workers_on_the_machine(eight_cores):
    assert worker_threads(1) == 8
    assert worker_threads(2) == 4
    assert worker_threads(3) == 2                  # rounded down
    assert worker_threads(16) == 1                 # never below one
    eight_cores.setenv("MPI_LOCALNRANKS", "4")     # hydra: 4 of the job's ranks on this machine
    assert workers_on_machine(8) == 4 and worker_threads(8) == 2
    eight_cores.delenv("MPI_LOCALNRANKS")
    eight_cores.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert worker_threads(8) == 4


def test_a_backend_placement_hint_counts_this_machines_workers(eight_cores):
    set_local_workers(2)                           # e.g. Ray: 2 of the pool's 6 on this node
    assert worker_threads(6) == 4
    assert worker_threads(1) == 8                  # a later one-worker session: all cores
    set_local_workers(None)
    assert worker_threads(6) == 1


def test_popxl_threads_wins_and_the_old_name_warns(eight_cores):
    eight_cores.setenv("POPXL_THREADS", "3")
    assert worker_threads(4) == 3
    eight_cores.setenv("POPXL_BLAS_THREADS", "5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert worker_threads(4) == 3              # the new name wins, no warning
    eight_cores.delenv("POPXL_THREADS")
    with pytest.warns(FutureWarning, match="POPXL_BLAS_THREADS is deprecated: set "
                                           "POPXL_THREADS=5"):
        assert worker_threads(4) == 5
    eight_cores.setenv("POPXL_THREADS", "0")
    with pytest.raises(ValueError, match="POPXL_THREADS must be a positive int, got 0"):
        worker_threads(1)


def test_replicas_at_once_and_their_op_threads(eight_cores):
    assert replica_threads(2, 1) == 2 and op_threads(2, 1) == 4    # 2 replicas x 4 threads
    assert replica_threads(1, 1) == 1 and op_threads(1, 1) == 8
    assert replica_threads(4, 4) == 2 and op_threads(2, 4) == 1    # 4 workers: 2 cores each
    eight_cores.setenv("POPXL_THREADS", "2")
    assert replica_threads(4, 1) == 2 and op_threads(2, 1) == 1
    eight_cores.setenv("POPXL_REPLICA_THREADS", "1")
    assert replica_threads(4, 1) == 1 and op_threads(1, 1) == 2
