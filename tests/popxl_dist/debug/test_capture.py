"""`popxl.debug.capture`: values of a loop body per iteration, a variable's value at the run's
start, and clear errors for what cannot be captured or stacked."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _loop_program(R: int = 2):
    ir = popxl.Ir(replication=R)
    made = {}
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.array([1, 2, 3], np.float32), name="w")
        x = ops.host_load(xs, "x")

        def body(t):
            made["doubled"] = t * 2.0
            return made["doubled"]

        g = ir.create_graph(body, x)
        y, = ops.repeat(g, 3, x)
        ops.var_updates.accumulate_(w, y)
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    return ir, xs, ys, w, made["doubled"]


def test_loop_iterations_and_variables():
    ir, xs, ys, w, doubled = _loop_program()
    data = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    with popxl.Session(ir, "ipu_hw") as sess:
        with popxl.debug.capture(sess, [doubled, w]) as cap:
            sess.run({xs: data})
            sess.run({xs: data})                      # the last run's values are kept
    calls = cap.calls(doubled)
    assert len(calls) == 3 and all(c.site[0].startswith("Loop.") for c in calls)
    for k, c in enumerate(calls):
        np.testing.assert_array_equal(c.value, data * 2.0 ** (k + 1))
    # w when the second run started: after one accumulate of 8x
    np.testing.assert_array_equal(cap[w], np.array([1, 2, 3], np.float32) + data * 8)


def test_errors():
    ir, xs, ys, w, doubled = _loop_program()
    other, *_ = _loop_program()
    with popxl.Session(ir, "ipu_hw") as sess:
        with pytest.raises(TypeError, match="popxl.Session"):
            popxl.debug.capture("session", [w])
        with pytest.raises(TypeError, match="popxl.Tensor"):
            popxl.debug.capture(sess, [np.zeros(3)])
        with pytest.raises(ValueError, match="another Ir"):
            popxl.debug.capture(sess, [other.main_graph.variables[0]])
        with popxl.debug.capture(sess, [w]) as cap:
            pass
        with pytest.raises(KeyError, match="not computed in the last run"):
            cap[w]
        with pytest.raises(KeyError, match="was not captured"):
            cap[doubled]
        with popxl.debug.capture(sess, [doubled]) as cap:
            sess.run({xs: np.ones((2, 3), np.float32)})
        with pytest.raises(ValueError, match="capture.calls"):
            cap[doubled]
