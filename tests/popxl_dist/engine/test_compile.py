"""The compiled program: value semantics despite NumPy views, by-ref/by-value calls, loops,
conditionals, and errors naming the op that failed."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import EngineError


def _run(build):
    ir = popxl.Ir()
    with ir.main_graph:
        outs = build(ir)
        streams = []
        for i, o in enumerate(outs):
            s = popxl.d2h_stream(o.shape, o.dtype, f"o{i}")
            ops.host_store(s, o)
            streams.append(s)
    with popxl.Session(ir, "cpu") as sess:
        res = sess.run()
        return [res[s] for s in streams], sess


def test_view_is_a_value_when_its_source_is_modified_later():
    def build(ir):
        x = popxl.variable(np.arange(6, dtype=np.float32), name="x")
        v = x.reshape((2, 3))           # NumPy would make this a view of x
        ops.add_(x, popxl.constant(np.ones(6, np.float32)))
        return [v, x]

    (v, x), _ = _run(build)
    np.testing.assert_array_equal(v, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(x, np.arange(6) + 1)


def test_modifying_a_view_does_not_change_its_source():
    def build(ir):
        x = popxl.variable(np.zeros((2, 2), np.float32), name="x")
        t = x.transpose()
        ops.add_(t, popxl.constant(np.ones((2, 2), np.float32)))
        return [x, t]

    (x, t), sess = _run(build)
    np.testing.assert_array_equal(x, 0)
    np.testing.assert_array_equal(t, 1)


def test_inplace_view_writes_through():
    def build(ir):
        x = popxl.variable(np.zeros((2, 2), np.float32), name="x")
        ops.add_(x.reshape_((4,)), popxl.constant(np.arange(4, dtype=np.float32)))
        return [x]

    (x,), _ = _run(build)
    np.testing.assert_array_equal(x, np.arange(4).reshape(2, 2))


@pytest.mark.parametrize("by_ref", [True, False])
def test_by_ref_and_by_value_calls(by_ref):
    def build(ir):
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        g = ir.create_empty_graph("inc")
        with g:
            t = popxl.graph_input((3,), popxl.float32, "t", by_ref=by_ref)
            ops.add_(t, popxl.constant(np.ones(3, np.float32)))
            popxl.graph_output(t * 1.0)
        out, = ops.call(g, v)
        return [v, out]

    (v, out), _ = _run(build)
    np.testing.assert_array_equal(out, 1)
    np.testing.assert_array_equal(v, 1 if by_ref else 0)


def test_set_parent_input_modified():
    def build(ir):
        v = popxl.variable(np.zeros(2, np.float32), name="v")
        g = ir.create_empty_graph("inc")
        with g:
            t = popxl.graph_input((2,), popxl.float32, "t")
            ops.add_(t, popxl.constant(np.ones(2, np.float32)))
        info = ops.call_with_info(g, v)
        info.set_parent_input_modified(v)
        return [v]

    (v,), _ = _run(build)
    np.testing.assert_array_equal(v, 1)


def test_repeat_carries_outputs_and_by_ref_state():
    def build(ir):
        counter = popxl.variable(np.zeros((), np.float32), name="counter")

        def body(x: popxl.Tensor, c: popxl.TensorByRef):
            ops.add_(c, popxl.constant(np.float32(1)))
            return x * 2.0

        g = ir.create_graph(body, popxl.TensorSpec((2,), popxl.float32), counter)
        x0 = popxl.constant(np.array([1.0, 3.0], np.float32))
        y, = ops.repeat(g, 5, x0, counter)
        return [y, counter]

    (y, c), _ = _run(build)
    np.testing.assert_array_equal(y, [32.0, 96.0])
    assert c == 5


@pytest.mark.parametrize("flag,want", [(True, 3.0), (False, -3.0)])
def test_conditional(flag, want):
    def build(ir):
        x = popxl.constant(np.float32(3.0))
        then_g = ir.create_graph(lambda a: a * 1.0, x)
        else_g = ir.create_graph(lambda a: -a, x)
        cond = popxl.constant(np.array(flag))
        y, = ops.conditional(cond, then_g, else_g, [x], [x])
        return [y]

    (y,), _ = _run(build)
    assert y == want


def test_kernel_error_names_the_op():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        i_in = popxl.h2d_stream((), popxl.int32, "i")
        y = ops.remote_load(buf, ops.host_load(i_in))   # entry 7 of 2: fails at run time
        s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s, y)
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(EngineError, match=r"RemoteLoad\.\d+ .*\(built at .*test_compile.py:\d+\)"):
            sess.run({i_in: np.array(7, np.int32)})


# --- reshape_ of a tensor NumPy cannot view in place (a transpose): upstream's aliasing --------
X0 = np.arange(6, dtype=np.float32).reshape(2, 3)
ADD = np.arange(6, dtype=np.float32) * 10


def test_reshape_inplace_of_a_transpose_reads_the_transposed_values():
    """T5's `logits.transpose(...).reshape_(...)`: NumPy has no view for it."""
    def build(ir):
        x = popxl.variable(X0, name="x")
        return [x.transpose().reshape_((6,)), x]

    (r, x), _ = _run(build)
    np.testing.assert_array_equal(r, X0.T.reshape(6))
    np.testing.assert_array_equal(x, X0)


def test_write_through_reshape_inplace_reaches_the_transpose_not_its_source():
    """The out-of-place transpose is a tensor of its own upstream: a write through its reshape_
    changes it (and the reshaped tensor), never `x`."""
    def build(ir):
        x = popxl.variable(X0, name="x")
        t = x.transpose()
        r = t.reshape_((6,))
        ops.add_(r, popxl.constant(ADD))
        return [x, t, r]

    (x, t, r), _ = _run(build)
    np.testing.assert_array_equal(x, X0)
    np.testing.assert_array_equal(t, X0.T + ADD.reshape(3, 2))
    np.testing.assert_array_equal(r, X0.T.reshape(6) + ADD)


def test_write_through_reshape_inplace_of_an_inplace_transpose_reaches_the_source():
    """transpose_ aliases x, reshape_ aliases that: a write through the end of the chain (and
    through a further reshape_ of it) reaches x; a later write to x reaches the chain."""
    def build(ir):
        x = popxl.variable(X0, name="x")
        r = x.transpose_().reshape_((6,))
        ops.add_(r.reshape_((3, 2)), popxl.constant(ADD.reshape(3, 2)))
        mid = r * 1.0
        ops.add_(x, popxl.constant(np.float32(100)))
        return [x, mid, r]

    (x, mid, r), _ = _run(build)
    want_x = X0 + ADD.reshape(3, 2).T
    np.testing.assert_array_equal(mid, want_x.T.reshape(6))
    np.testing.assert_array_equal(x, want_x + 100)
    np.testing.assert_array_equal(r, (want_x + 100).T.reshape(6))


def test_reshape_inplace_of_a_non_contiguous_by_ref_input_writes_back_to_the_caller():
    """The caller passes a transposed view of `y` by reference; the callee writes through a
    reshape_ of it: the caller's transpose changes, `y` does not (its own tensor upstream)."""
    def build(ir):
        y = popxl.variable(X0, name="y") + 0.0
        t = y.transpose()
        g = ir.create_empty_graph("write")
        with g:
            a = popxl.graph_input((3, 2), popxl.float32, "a", by_ref=True)
            ops.add_(a.reshape_((6,)), popxl.constant(ADD))
        ops.call(g, t)
        return [t]

    (t,), _ = _run(build)
    np.testing.assert_array_equal(t, X0.T + ADD.reshape(3, 2))


def test_compiled_code_has_no_name_lookups():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(4, np.float32), name="x")
        y = ops.gelu(x @ popxl.variable(np.ones((4, 4), np.float32), name="w"))
        s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s, y)
    sess = popxl.Session(ir, "cpu")
    src = sess._runtime.worker.program.main.source
    assert "def run(ctx)" in src and "'" not in src and "[\"" not in src


def test_scalar_results_stay_arrays_for_in_place_ops():
    """NumPy returns scalars for 0-d results; an in-place op on such a result must still work
    (e.g. a layer counter `c = init + 3; c += 1`)."""
    ir = popxl.Ir()
    with ir.main_graph:
        c = ops.init((), popxl.int32, "c", "zero") + 3
        c += 1
        f = ops.exp(popxl.constant(0.0, popxl.float32))
        f += 1.0
        s, t = popxl.d2h_stream((), popxl.int32, "s"), popxl.d2h_stream((), popxl.float32, "t")
        ops.host_store(s, c)
        ops.host_store(t, f)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()
    assert int(out[s]) == 4 and float(out[t]) == 2.0
