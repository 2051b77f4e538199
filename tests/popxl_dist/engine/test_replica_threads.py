"""Replicas of one worker run in parallel threads where cores are free: the same bits as one
after the other, failures still name the replica."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.engine.executor import replica_threads
from popxl.errors import EngineError


def _program(all_reduce: bool):
    rng = np.random.default_rng(0)
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        xs = popxl.h2d_stream((32, 64), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        w = popxl.variable(rng.normal(size=(64, 64)).astype(np.float32), name="w")
        y = ops.gelu(x @ w)
        g = ops.softmax(y, -1) @ w
        if all_reduce:
            g = ops.collectives.replicated_all_reduce(g, op="mean")
        ops.scaled_add_(w, g.transpose() @ x, b=-0.01)
        o = popxl.d2h_stream((32, 64), popxl.float32, "g")
        ops.host_store(o, g)
    data = rng.normal(size=(4, 32, 64)).astype(np.float32)
    return ir, xs, o, w, data


@pytest.mark.parametrize("all_reduce", [False, True])
def test_parallel_replicas_give_the_same_bits(monkeypatch, all_reduce):
    results = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("POPXL_REPLICA_THREADS", threads)
        ir, xs, o, w, data = _program(all_reduce)
        with popxl.Session(ir, "ipu_hw") as sess:
            assert (sess._runtime.worker._pool is None) == (threads == "1")
            outs = [sess.run({xs: data})[o] for _ in range(2)]
            results[threads] = outs + [sess.get_tensor_data(w)]
    for a, b in zip(results["1"], results["4"]):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_failure_in_a_parallel_replica_names_it(monkeypatch):
    monkeypatch.setenv("POPXL_REPLICA_THREADS", "2")
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.int32, "i")
        i = ops.host_load(xs, "i")
        table = popxl.variable(np.ones((3, 2), np.float32), name="table")
        # nll reads probabilities at the labels: a label out of range fails in its kernel
        loss = ops.nll_loss(ops.softmax(table, -1), i)
        o = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(o, loss)
    with popxl.Session(ir, "ipu_hw") as sess:
        bad = np.array([[0, 1, 1], [0, 5, 1]], np.int32)      # replica 1 has label 5
        with pytest.raises(EngineError, match="replica 1"):
            sess.run({xs: bad})


def test_thread_count_rule(monkeypatch):
    for v in ("POPXL_REPLICA_THREADS", "POPXL_THREADS", "POPXL_BLAS_THREADS", "MPI_LOCALNRANKS",
              "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert replica_threads(4, 1) == 4
    assert replica_threads(4, 2) == 4
    assert replica_threads(4, 4) == 2
    assert replica_threads(1, 1) == 1
    monkeypatch.setenv("MPI_LOCALNRANKS", "8")
    assert replica_threads(4, 2) == 1
    monkeypatch.setenv("POPXL_REPLICA_THREADS", "3")
    assert replica_threads(4, 2) == 3
    monkeypatch.setenv("POPXL_REPLICA_THREADS", "x")
    with pytest.raises(ValueError, match="POPXL_REPLICA_THREADS"):
        replica_threads(4, 2)
