"""transforms.repeat_graph: the ops of a graph run N times, bitwise as N unrolled copies."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl_addons.transforms.repeat_graph import repeat_graph


def _accumulate_program(n_copies: int):
    """v += x; host_store(v * 2); host_store(sum(x)) -- written `n_copies` times."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x_stream = popxl.h2d_stream((3,), popxl.float32, "x")
        v = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32), name="v")
        out = popxl.d2h_stream((3,), popxl.float32, "out")
        total = popxl.d2h_stream((), popxl.float32, "total")
        for _ in range(n_copies):
            x = ops.host_load(x_stream, "x")
            ops.var_updates.accumulate_(v, x)
            ops.host_store(out, v * 2.0)
            ops.host_store(total, ops.sum(x))
    return ir, x_stream, v, out, total


def _run(ir, x_stream, v, out, total, xs):
    ir.num_host_transfers = len(xs)
    with popxl.Session(ir, "ipu_hw") as s:
        res = s.run({x_stream: xs})
        return res[out], res[total], s.get_tensor_data(v).copy()


def test_repeat_main_graph_equals_unrolled_bitwise():
    xs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    ir, *handles = _accumulate_program(1)
    body = repeat_graph(ir.main_graph, 4)
    assert body.id.startswith("repeat_graph")
    # The main graph keeps only the loop; the body holds the ops in creation order.
    assert [op.type for op in ir.main_graph._data.ops] == ["Loop"]
    types = [op.type for op in body._data.ops]
    assert types.index("Accumulate") < types.index("Mul") < types.index("ReduceSum")
    assert [t.name for t in body.inputs] == ["v"] and body._by_ref_inputs == {body.inputs[0]}
    repeated = _run(ir, *handles, xs)
    unrolled = _run(*_accumulate_program(4), xs)
    for a, b in zip(repeated, unrolled):
        assert a.tobytes() == b.tobytes()
    expected_v = np.array([1.0, 2.0, 3.0], np.float32)
    for i in range(4):
        expected_v = expected_v + xs[i]
        np.testing.assert_array_equal(repeated[0][i], expected_v * 2)
    np.testing.assert_array_equal(repeated[2], expected_v)


def test_repeat_count_one_or_less_is_untouched():
    ir, *_ = _accumulate_program(1)
    n_graphs = len(ir._data.graphs)
    n_ops = len(ir.main_graph._data.ops)
    for count in (1, 0, -2):
        assert repeat_graph(ir.main_graph, count) is ir.main_graph
    assert len(ir._data.graphs) == n_graphs
    assert len(ir.main_graph._data.ops) == n_ops


def test_repeat_subgraph_with_outputs_and_by_ref_input():
    """A called subgraph: its in-place update of a by-ref input happens N times and its output
    is the last iteration's value."""
    ir = popxl.Ir()
    with ir.main_graph:
        counter = popxl.variable(np.array([5.0], np.float32), name="counter")

        def step(c: popxl.TensorByRef, scale: popxl.Tensor):
            ops.var_updates.accumulate_(c, popxl.constant(np.array([1.0], np.float32)))
            return c * scale

        g = ir.create_graph(step, counter, popxl.TensorSpec((1,), popxl.float32))
        body = repeat_graph(g, 3)
        scale = popxl.variable(np.array([10.0], np.float32), name="scale")
        (y,) = ops.call(g, counter, scale)
        out = popxl.d2h_stream((1,), popxl.float32, "y")
        ops.host_store(out, y)
    assert len(g.outputs) == 1 and len(body.outputs) == 1
    with popxl.Session(ir, "ipu_hw") as s:
        res = s.run()
        c = s.get_tensor_data(counter)
    np.testing.assert_array_equal(c, [8.0])
    np.testing.assert_array_equal(res[out], [80.0])


def test_fragment_ops_stay_and_rts_shard_is_by_ref():
    """RTS shards come from the WeightsFromHost fragment; repeating the main graph keeps the
    fragments and updates the shard in place every iteration."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        full, shard = popxl.replica_sharded_variable(np.arange(4, dtype=np.float32), name="w")
        ops.var_updates.accumulate_(shard, popxl.constant(np.ones(2, np.float32)))
        fragments = [op.exec_ctx for op in ir.main_graph._data.ops]
    repeat_graph(ir.main_graph, 3)
    ctxs = [op.exec_ctx for op in ir.main_graph._data.ops]
    assert ctxs.count("WeightsFromHostFragment") == fragments.count("WeightsFromHostFragment")
    assert ctxs.count("WeightsToHostFragment") == fragments.count("WeightsToHostFragment")
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        data = s.get_tensor_data(full)
    np.testing.assert_array_equal(data, np.arange(4, dtype=np.float32) + 3)


def test_bad_arguments():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(1.0)
    with pytest.raises(TypeError, match="repeat_count"):
        repeat_graph(ir.main_graph, 2.0)
    with pytest.raises(TypeError, match="popxl.Graph"):
        repeat_graph("main", 2)
