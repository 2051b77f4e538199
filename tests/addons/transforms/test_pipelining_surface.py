"""The pipelining transform's upstream members: `Pipelining` driven directly (as
`pipelined_execution` drives it) with its bookkeeping (`original_tid_to_graph`,
`original_tid_to_cloned_tensor`, `ipu_copy_dummy_inputs`), and `PipelineBoundGraph`."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl_addons.transforms.pipelining import (PipelineBoundGraph, Pipelining, StageContext,
                                                pipelined_execution)

STEPS = 6


def _three_stages(ir):
    """x -> (stage 0, ipu 0) x * 2 -> (stage 1, ipu 1) + 1 -> (stage 2, ipu 2) * 3 -> y, over
    STEPS micro batches, with Pipelining driven by hand as `pipelined_execution` drives it."""
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        graph = popxl.gcg()
        context = StageContext()
        handle = graph.register_op_created_hook(context.hook)
        with context.stage(0), popxl.ipu(0):
            h = (ops.host_load(xs, "x") * 2.0).copy_to_ipu(1, 0)
        with context.stage(1), popxl.ipu(1):
            h1 = (h + 1.0).copy_to_ipu(2, 1)
        with context.stage(2), popxl.ipu(2):
            ops.host_store(ys, h1 * 3.0)
        graph.remove_op_created_hook(handle)
        p = Pipelining(graph, STEPS)
        p.apply(context.ops)
    return xs, ys, h, p


def test_driven_directly_runs_the_pipeline():
    ir = popxl.Ir()
    xs, ys, h, p = _three_stages(ir)
    x = np.arange(2 * STEPS, dtype=np.float32).reshape(STEPS, 2)
    ir.num_host_transfers = STEPS
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run({xs: x})[ys], (x * 2 + 1) * 3)
    # h (made by the copy) now lives in the graph of IPU copies; the stage graphs are
    # PipelineBoundGraphs that know which original tensors they make and read.
    assert p.original_tid_to_graph[h.id] is p.ipu_copies
    assert p.original_tid_to_cloned_tensor[h.id] in p.ipu_copies.graph
    assert isinstance(p.stages[0], PipelineBoundGraph) and set(p.stages) == {0, 1, 2}
    assert h.id in p.ipu_copies.original_output_ids and h.id in p.stages[1]
    assert h.id not in p.stages[0]
    # In the first ramp-up cycle the copy to stage 2 reads zeros standing for stage 1's
    # not yet computed value.
    assert len(p.ipu_copy_dummy_inputs) == 1
    (dummy,) = p.ipu_copy_dummy_inputs.values()
    assert dummy.shape == (2,) and dummy._graph.id.startswith("pipeline_graph")


def test_apply_needs_the_stage_map():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(NotImplementedError, match="pass include_ops"):
            Pipelining(ir.main_graph, 4).apply()


def test_move_copied_tensor_out_of_nested_repeat_graph_is_not_needed():
    ir = popxl.Ir()
    with pytest.raises(NotImplementedError, match="loop-carried outputs"):
        Pipelining(ir.main_graph, 4).move_copied_tensor_out_of_nested_repeat_graph(0, "t", None)


def test_pipelined_execution_unchanged_by_direct_use():
    """The same program through `pipelined_execution` builds the same graphs."""
    def names(ir):
        return sorted(gid.rsplit("_subgraph(", 1)[0] for gid in ir._data.graphs)

    ir_a = popxl.Ir()
    _three_stages(ir_a)
    ir_b = popxl.Ir()
    with ir_b.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        with pipelined_execution(STEPS) as p:
            with p.stage(0), popxl.ipu(0):
                h = (ops.host_load(xs, "x") * 2.0).copy_to_ipu(1, 0)
            with p.stage(1), popxl.ipu(1):
                h1 = (h + 1.0).copy_to_ipu(2, 1)
            with p.stage(2), popxl.ipu(2):
                ops.host_store(ys, h1 * 3.0)
    assert names(ir_a) == names(ir_b)


def test_pipeline_bound_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        v = popxl.variable(np.array([10.0, 20.0], np.float32), name="v")
        g = PipelineBoundGraph(ir.create_empty_graph("stage"))
        w_in = g.add_variable_input(w)
        assert g.add_variable_input(w) is w_in              # one input per tensor
        with g.graph:
            out = w_in * 3.0
            popxl.graph_output(out)
        g.add_output_tensor(out, "w_times_3")
        assert g.original_output_ids == ["w_times_3"]
        assert "w_times_3" in g and w in g and w.id in g and v not in g
        (a,) = g.call()
        g.reconnect_input(w.id, v)                       # feed v from now on
        (b,) = g.call()
        with pytest.raises(KeyError, match="no input for 'nope'"):
            g.reconnect_input("nope", v)
        sa = popxl.d2h_stream((2,), popxl.float32, "a")
        sb = popxl.d2h_stream((2,), popxl.float32, "b")
        ops.host_store(sa, a)
        ops.host_store(sb, b)
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()
    np.testing.assert_array_equal(got[sa], [3.0, 6.0])
    np.testing.assert_array_equal(got[sb], [30.0, 60.0])
