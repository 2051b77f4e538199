"""route_tensor's building blocks: connect_call_op, connect_loop_op and
connect_tensor_to_ops_on_path route a tensor down one call path at a time."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl_addons.route_tensor import (called_graph_paths, connect_call_op, connect_loop_op,
                                       connect_tensor_to_ops_on_path)


def _program(modified: bool):
    """main --repeat(3)--> outer --call--> inner; inner adds the routed `w` to `acc` (and,
    with `modified`, increments the routed `w` in place)."""
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        w = popxl.variable(np.array([1.5, -2.0], np.float32), name="w")
        inner = ir.create_empty_graph("inner")
        with inner:
            popxl.graph_input((2,), popxl.float32, "acc", by_ref=True)
        outer = ir.create_empty_graph("outer")
        with outer:
            a = popxl.graph_input((2,), popxl.float32, "acc", by_ref=True)
            ops.call(inner, a)
        ops.repeat(outer, 3, acc)
    return ir, acc, w, outer, inner


@pytest.mark.parametrize("modified", [False, True])
def test_connect_tensor_to_ops_on_path(modified):
    ir, acc, w, outer, inner = _program(modified)
    path, = called_graph_paths(ir.main_graph, inner)
    routed = {}
    w_in = connect_tensor_to_ops_on_path(path, w, routed, modified)
    assert w_in in inner and w_in.shape == (2,) and routed[inner.id] is w_in
    assert set(routed) == {op.called[0] for op in path}
    with inner:
        ops.var_updates.accumulate_(inner.inputs[0], w_in)
        if modified:
            ops.var_updates.accumulate_(w_in, popxl.constant(np.ones(2, np.float32)))
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        got = sess.get_tensors_data([acc, w])
    w0 = np.array([1.5, -2.0], np.float32)
    if modified:      # w grows by one each iteration, after being added
        np.testing.assert_array_equal(got[acc], 3 * w0 + 3)
        np.testing.assert_array_equal(got[w], w0 + 3)
    else:
        np.testing.assert_array_equal(got[acc], 3 * w0)
        np.testing.assert_array_equal(got[w], w0)


def test_connect_ops_one_at_a_time_and_again():
    ir, acc, w, outer, inner = _program(False)
    loop, wrapper_call, call = called_graph_paths(ir.main_graph, inner)[0]
    routed = {}
    t1 = connect_loop_op(loop, w, routed, False)
    n_inputs = len(ir._graph(loop.called[0]).inputs)
    # Connecting the same op again reuses the input it already feeds.
    assert connect_loop_op(loop, w, routed, False) is t1
    assert len(ir._graph(loop.called[0]).inputs) == n_inputs
    t2 = connect_call_op(wrapper_call, t1, routed, False)
    t3 = connect_call_op(call, t2, routed, False)
    assert t3 in inner and t2 in outer
    with inner:
        ops.var_updates.accumulate_(inner.inputs[0], t3)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(acc), [4.5, -6.0])


def test_connect_checks_the_op():
    ir, acc, w, outer, inner = _program(False)
    loop, wrapper_call, call = called_graph_paths(ir.main_graph, inner)[0]
    with pytest.raises(TypeError, match="expected a Call op"):
        connect_call_op(loop, w, {}, False)
    with pytest.raises(ValueError, match="is not in the graph of tensor 'w'"):
        connect_call_op(call, w, {}, False)
    with pytest.raises(TypeError, match="expected an op"):
        connect_tensor_to_ops_on_path(["not an op"], w, {}, False)
