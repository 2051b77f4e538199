"""Planning hints: available-memory proportion by IPU and the fully-connected pass are recorded on
the ops (read back as upstream's ops report them) and change no numbers."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons


def _program():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="x")
        with popxl.ipu(0):
            a = x @ popxl.variable(np.ones((3, 4), np.float32))
        g = ir.create_graph(lambda t: t @ popxl.constant(np.ones((4, 2), np.float32)), a)
        with popxl.ipu(1):
            (b,) = ops.call(g, a.copy_to_ipu(1))
            c = ops.gather(b, popxl.constant(np.array([1, 0], np.int32)))
        s = popxl.d2h_stream(c.shape, c.dtype, "c")
        ops.host_store(s, c)
    return ir, s


def _ops(ir, op_type):
    return [op for gd in ir._data.graphs.values() for op in gd.ops if op.type == op_type]


def test_available_memory_proportion_by_ipu():
    ir, s = _program()
    addons.set_available_memory_proportion_by_ipu(ir, [0.3, 0.5])
    by_ipu = sorted((op.ipu, op.getAvailableMemoryProportion()) for op in _ops(ir, "MatMul"))
    assert by_ipu == [(0, 0.3), (0, 0.3)]    # the subgraph's matmul was built on IPU 0 too
    (gather,) = _ops(ir, "Gather")
    assert gather.getAvailableMemoryProportion() == 0.5
    (sub,) = [gid for gid in ir._data.graphs if "lambda" in gid]
    addons.set_graph_available_memory_proportion_by_ipu(ir._graph(sub), [0.1])
    assert sorted(op.getAvailableMemoryProportion() for op in _ops(ir, "MatMul")) == [0.1, 0.3]
    with pytest.raises(ValueError, match="only 1 proportion"):
        addons.set_available_memory_proportion_by_ipu(ir, [0.2])
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        addons.set_available_memory_proportion_by_ipu(ir, [0.2, 1.5])
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run()[s], [[48.0, 48.0], [12.0, 12.0]])


def test_fc_pass_switch():
    ir, s = _program()
    matmuls = _ops(ir, "MatMul")
    assert all(op.useFullyConnectedPass() for op in matmuls)
    addons.disable_fc_pass(ir)
    assert not any(op.useFullyConnectedPass() for op in matmuls)
    addons.enable_fc_pass(ir)
    assert all(op.useFullyConnectedPass() for op in matmuls)
    addons.disable_fc_pass(ir)
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run()[s], [[48.0, 48.0], [12.0, 12.0]])
