"""pipelined_execution: real pipeline graphs (ramp-up, main cycles in a repeat, ramp-down) whose
numbers equal the same ops run `steps` times in program order, bit for bit."""
from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons

import pipeline_program as pp


def _graphs(ir):
    return {gid.rsplit("_subgraph(", 1)[0]: ir._graph(gid) for gid in ir._data.graphs}


@pytest.mark.parametrize("steps, explicit_stash", [(6, False), (7, True), (11, False)])
def test_pipelined_equals_plain_bitwise(steps, explicit_stash):
    xs, ys = pp.data(steps)
    piped = pp.run(pp.build(steps, True, explicit_stash=explicit_stash), xs, ys, runs=2)
    plain = pp.run(pp.build(steps, False), xs, ys, runs=2)
    for (la, ha), (lb, hb) in zip(piped[0], plain[0]):
        assert la.shape == (steps,) and ha.shape == (steps, pp.BATCH, pp.HIDDEN)
        assert la.tobytes() == lb.tobytes() and ha.tobytes() == hb.tobytes()
    assert sorted(piped[1]) == sorted(plain[1])
    for k in piped[1]:
        assert piped[1][k].tobytes() == plain[1][k].tobytes(), k
    # The accumulated gradient is a real mean over all micro batches (not a stale one).
    assert float(piped[1]["grad0.mean_accum_counter"]) == 2 * steps
    assert np.abs(piped[1]["grad0.accum.weight"]).sum() > 0


def test_pipeline_graph_structure():
    steps, stages = 8, 3
    prog = pp.build(steps, True)
    graphs = _graphs(prog.ir)
    for name in ("pipeline_graph", "pipeline_main_cycle", "pipeline_ipu_copy",
                 "pipeline_stage_0_load", "pipeline_stage_1_load", "pipeline_stage_1_store",
                 *(f"pipeline_stage_{s}_compute" for s in range(stages))):
        assert name in graphs, name
    assert "pipeline_stage_2_load" not in graphs and "pipeline_stage_0_store" not in graphs
    main_ops = [op.type for op in prog.ir.main_graph._data.ops]
    assert main_ops == ["Call"]
    pipeline = graphs["pipeline_graph"]
    calls = Counter(op.called[0].rsplit("_subgraph(", 1)[0]
                    for op in pipeline._data.ops if op.type == "Call")
    # Ramp-up runs stages [0, 1) and [0, 2); ramp-down [1, 3) and [2, 3): every stage twice.
    for s in range(stages):
        assert calls[f"pipeline_stage_{s}_compute"] == stages - 1
    assert calls["pipeline_ipu_copy"] == 2 * (stages - 1)
    (loop,) = [op for op in pipeline._data.ops if op.type == "Loop"]
    assert loop.attrs["trip_count"] == steps - (stages - 1)
    # The IPU copies carry micro batches from one cycle to the next; placement is kept.
    copies = graphs["pipeline_ipu_copy"]._data.ops
    assert sorted((op.type, op.ipu) for op in copies) == [("IpuCopy", 0), ("IpuCopy", 1)]
    assert len(graphs["pipeline_main_cycle"].outputs) == 2
    assert {op.ipu for op in graphs["pipeline_stage_1_compute"]._data.ops} == {1}
    assert {op.ipu for op in graphs["pipeline_stage_2_compute"]._data.ops} == {0}


def _tiny(steps, body):
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        body(s)
    return ir


def test_op_outside_stage_raises():
    def body(s):
        with addons.pipelined_execution(4) as p:
            with p.stage(0):
                x = ops.host_load(s)
            x + 1.0
    with pytest.raises(RuntimeError, match=r"^Operation must be created in a stage context\.$"):
        _tiny(4, body)


def test_steps_below_twice_the_stages_raises():
    def body(s):
        with addons.pipelined_execution(3) as p:
            with p.stage(0):
                x = ops.host_load(s).copy_to_ipu(1)
            with p.stage(1):
                ops.host_store(popxl.d2h_stream((2,), popxl.float32, "y"), x * 2.0)
    with pytest.raises(ValueError, match="Pipelining requires the steps at least 2x the number "
                                         "of stages"):
        _tiny(3, body)


def test_cross_stage_read_without_copy_or_stash_raises():
    def body(s):
        with addons.pipelined_execution(6) as p:
            with p.stage(0):
                x = ops.host_load(s)
                y = x.copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                z = (y * 2.0).copy_to_ipu(0)
            with p.stage(2):
                z + x     # x belongs to stage 0: needs stash_and_restore_tensor
    with pytest.raises(ValueError,
                       match="in stage 2 reads tensor 'x_hostload', which belongs to stage 0"):
        _tiny(6, body)


def test_stream_in_two_stages_raises():
    def body(s):
        with addons.pipelined_execution(4) as p:
            with p.stage(0):
                x = ops.host_load(s).copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                x + ops.host_load(s)
    with pytest.raises(ValueError, match="used by stages 0 and 1"):
        _tiny(4, body)


def test_stash_needs_a_stage_and_a_known_source():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, np.float32))
        with addons.pipelined_execution(4) as p:
            with pytest.raises(RuntimeError, match="inside a stage context"):
                p.stash_and_restore_tensor(v)
            with p.stage(1):
                with pytest.raises(ValueError, match="pass `from_stage`"):
                    p.stash_and_restore_tensor(v)
                with pytest.raises(ValueError, match="earlier stage"):
                    p.stash_and_restore_tensor(v, from_stage=2)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        with ir.main_graph, addons.pipelined_execution(0):
            pass


def test_store_of_a_tensor_updated_later_in_its_stage_sees_its_value_at_the_store():
    """Stores and copies run after the stage's compute: a tensor the stage changes in place
    after storing it is snapshotted at the store."""
    steps = 4
    results = []
    for pipelined in (True, False):
        ir = popxl.Ir()
        with ir.main_graph:
            s = popxl.h2d_stream((2,), popxl.float32, "x")
            before = popxl.d2h_stream((2,), popxl.float32, "before")
            after = popxl.d2h_stream((2,), popxl.float32, "after")
            acc = popxl.variable(np.zeros(2, np.float32), name="acc")
            region = addons.pipelined_execution(steps) if pipelined else \
                contextlib.nullcontext(pp.PlainStages())
            with region as p:
                with p.stage(0):
                    x = ops.host_load(s) * 1.0
                    ops.host_store(before, x)
                    ops.var_updates.accumulate_(x, popxl.constant(np.ones(2, np.float32)))
                    y = x.copy_to_ipu(1)
                    ops.var_updates.accumulate_(x, popxl.constant(np.ones(2, np.float32)))
                    ops.var_updates.accumulate_(acc, x)
                with p.stage(1):
                    ops.host_store(after, y)
            if not pipelined:
                pp.repeat_graph(ir.main_graph, steps)
        ir.num_host_transfers = steps
        xs = np.arange(steps * 2, dtype=np.float32).reshape(steps, 2)
        with popxl.Session(ir, "ipu_hw") as sess:
            out = sess.run({s: xs})
            results.append((out[before], out[after], sess.get_tensor_data(acc).copy()))
    (b0, a0, acc0), (b1, a1, acc1) = results
    np.testing.assert_array_equal(b0, xs)
    np.testing.assert_array_equal(a0, xs + 1)
    np.testing.assert_array_equal(acc0, (xs + 2).sum(0))
    assert b0.tobytes() == b1.tobytes() and a0.tobytes() == a1.tobytes()
    assert acc0.tobytes() == acc1.tobytes()


def test_tensors_made_in_the_pipeline_cannot_be_used_after_it():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        with addons.pipelined_execution(2) as p:
            with p.stage(0):
                x = ops.host_load(s) * 2.0
        with pytest.raises(ValueError, match="no longer exists in graph"):
            x + 1.0
