"""Session faults that used to give silently wrong answers: a failed Session, exceptions inside
`with session:`, live host buffers, ops added after the Session, host-transfer mismatches,
downcast overflow and unchecked arguments. (The same Session cases run on mpi and ray in
`runtime/test_backends.py`.)"""
import os
import re
import sys

import numpy as np
import pytest

import popxl
import popxl.ops as ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "runtime"))
import session_cases  # noqa: E402


@pytest.mark.parametrize("workers", [None, "2"])
@pytest.mark.parametrize("case", sorted(session_cases.CASES))
def test_session_case_on_local_backend(monkeypatch, case, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    session_cases.CASES[case]()


# --- the Ir is frozen once a Session exists ------------------------------------------------
def test_ops_tensors_and_graphs_added_after_a_session_raise():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, np.float32), name="v")
        ops.add_(v, popxl.constant(np.ones(2, np.float32)))
    sess = popxl.Session(ir, "ipu_hw")
    with ir.main_graph:
        with pytest.raises(RuntimeError, match=r"Add.*frozen because a popxl.Session"):
            v + v
        with pytest.raises(RuntimeError, match="frozen"):
            popxl.variable(np.ones(2, np.float32), name="late")
        with pytest.raises(RuntimeError, match="frozen"):
            popxl.constant(1.0)
    with pytest.raises(RuntimeError, match="frozen"):
        ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((2,), popxl.float32))
    with pytest.raises(RuntimeError, match="setting num_host_transfers.*frozen"):
        ir.num_host_transfers = 2
    with sess:                        # the program that was compiled still runs
        sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(v), 1)


def test_another_ir_can_still_be_built():
    ir = popxl.Ir()
    with ir.main_graph:
        ops.add_(popxl.variable(np.zeros(1, np.float32)), popxl.constant(np.ones(1, np.float32)))
    popxl.Session(ir, "ipu_hw")
    other = popxl.Ir()
    with other.main_graph:
        popxl.variable(np.zeros(1, np.float32)) + 1.0


# --- host transfers (reference §2) --------------------------------------------------------
def _transfer_program(n, loads_per_iter=1, store_in_repeat=True):
    """`n` transfers; a repeat of `n` iterations loads x `loads_per_iter` times each and stores
    their sum (or stores once after the repeat)."""
    ir = popxl.Ir()
    ir.num_host_transfers = n
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")

        def body(a: popxl.TensorByRef):
            x = ops.host_load(xs, "x")
            for _ in range(loads_per_iter - 1):
                x = x + ops.host_load(xs, "x") * 10.0
            ops.add_(a, x)
            if store_in_repeat:
                ops.host_store(ys, x)

        ops.repeat(ir.create_graph(body, acc), n, acc)
        if not store_in_repeat:
            ops.host_store(ys, acc + 0.0)
    return ir, xs, ys, acc


def test_an_output_stored_fewer_times_than_transfers_reads_zero_there():
    """Upstream accepts it (BERT's squad_inference with device_iterations > 1 stores once per
    run); the transfers no host_store wrote are zero (upstream: uninitialised memory)."""
    ir, xs, ys, acc = _transfer_program(4, store_in_repeat=False)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: np.ones((4, 2), np.float32)})[ys]
    np.testing.assert_array_equal(out, [[4, 4], [0, 0], [0, 0], [0, 0]])


def test_an_output_stored_only_in_an_uncalled_graph_reads_zero():
    ir = popxl.Ir()
    ir.num_host_transfers = 2
    with ir.main_graph:
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        ir.create_graph(lambda t: ops.host_store(ys, t), popxl.TensorSpec((2,), popxl.float32))
    with popxl.Session(ir, "ipu_hw") as sess:
        outs = {ys: np.full((2, 2), np.nan, np.float32)}
        sess.run_with_outputs({}, outs)
    np.testing.assert_array_equal(outs[ys], 0)


def test_upstream_rules_kept_more_rows_wrap_around_and_first_rows():
    """§2: an input may have more transfers than num_host_transfers; the k-th load reads
    transfer k % T (two loads per iteration consume consecutive transfers and wrap)."""
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    ir, xs, ys, acc = _transfer_program(3)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: data})[ys]           # 6 rows for 3 transfers: the first 3 read
        np.testing.assert_array_equal(out, data[:3])
    ir, xs, ys, acc = _transfer_program(3, loads_per_iter=2)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: data[:3]})[ys]       # loads 0..5 read rows 0,1,2,0,1,2
        rows = data[[0, 1, 2, 0, 1, 2]].reshape(3, 2, 2)
        np.testing.assert_array_equal(out, rows[:, 0] + rows[:, 1] * 10)
    with pytest.raises(ValueError, match=r"expects an array of shape \(3, 2\)"):
        with popxl.Session(_transfer_program(3)[0], "ipu_hw") as sess:
            sess.run({sess.expected_inputs().pop(): data[:2]})


# --- downcast of 64-bit inputs ------------------------------------------------------------
def _identity_program(dtype):
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), dtype, "x")
        ys = popxl.d2h_stream((3,), dtype, "y")
        ops.host_store(ys, ops.host_load(xs, "x") + popxl.constant(0, dtype))
    return ir, xs, ys


@pytest.mark.parametrize("dtype,data,bad", [
    (popxl.int32, np.array([1, 2 ** 40 + 5, 3]), 2 ** 40 + 5),
    (popxl.int32, np.array([1, -2 ** 31 - 1, 3]), -2 ** 31 - 1),
    (popxl.uint32, np.array([1, 2 ** 32, 3], np.uint64), 2 ** 32),
    (popxl.float32, np.array([1.0, -1e39, 3.0]), -1e39),
])
def test_downcast_that_changes_a_value_raises_naming_stream_and_value(dtype, data, bad):
    ir, xs, ys = _identity_program(dtype)
    with popxl.Session(ir, "ipu_hw") as sess:
        with pytest.raises(ValueError, match=rf"stream 'x' has value {re.escape(repr(bad))} at "
                                             rf"index \(1,\) that (does not fit|overflows) "
                                             rf"{dtype.name}"):
            sess.run({xs: data})


@pytest.mark.parametrize("dtype,data", [
    (popxl.int32, np.array([1, -2 ** 31, 2 ** 31 - 1])),
    (popxl.float32, np.array([1.5, np.inf, np.nan])),
    (popxl.float32, np.array([1e-50, -3.4e38, 0.0])),
])
def test_downcast_that_keeps_values_works(dtype, data):
    ir, xs, ys = _identity_program(dtype)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: data})[ys]
    np.testing.assert_array_equal(out, data.astype(dtype.as_numpy()))


# --- collective timeouts on worker threads ------------------------------------------------
def test_collective_timeout_on_worker_threads_names_op_replicas_and_silent_worker(monkeypatch):
    """Replica 1 (worker thread 1) computes a long loop before the all-reduce that replica 0
    (worker 0) waits in: CollectiveTimeout at the timeout, not when the loop ends."""
    import time

    from popxl.errors import CollectiveTimeout
    from popxl.runtime.backends import threads

    monkeypatch.setenv("POPXL_WORKERS", "2")
    monkeypatch.setenv("POPXL_COLLECTIVE_TIMEOUT", "0.3")
    monkeypatch.setattr(threads, "_POOLS", {})
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        cs = popxl.h2d_stream((), popxl.bool, "slow")
        x = popxl.variable(np.ones((64, 64), np.float32), name="x")
        loop = ir.create_graph(lambda t: ops.matmul(t, t) * (1 / 64), x)
        slow = ir.create_graph(lambda t: ops.repeat(loop, 150_000, t)[0], x)
        fast = ir.create_graph(lambda t: t + 0.0, x)
        y, = ops.conditional(ops.host_load(cs, "slow"), slow, fast, then_inputs=[x],
                             else_inputs=[x])
        ops.collectives.replicated_all_reduce_(y)
    with popxl.Session(ir, "ipu_hw") as sess:
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout) as info:
            sess.run({cs: np.array([False, True])})
        took = time.monotonic() - t0
    msg = str(info.value)
    assert "ReplicatedAllReduceInplace" in msg and "on replica 0 (worker 0)" in msg, msg
    assert "waiting for worker 1 (replica 1)" in msg, msg
    assert info.value.workers == (1,) and info.value.replicas == (0,)
    assert took < 0.3 + 1.5, f"raised after {took:.2f} s"
    ir2 = popxl.Ir(replication=2)           # a new Session gets a new pool of threads
    with ir2.main_graph:
        ops.collectives.replicated_all_reduce_(popxl.variable(np.ones(2, np.float32)))
    with popxl.Session(ir2, "ipu_hw") as sess:
        sess.run()
