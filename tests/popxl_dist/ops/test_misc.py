"""identity, cast, print_tensor, ipu_copy, io_tile_copy."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import check_forward, check_grads, grads, run_ops


def test_print_tensor_prints_at_run_time_and_passes_through(capsys):
    x = np.array([[1.5, -2.0], [0.25, 4.0]], np.float32)
    y, = run_ops(lambda t: ops.print_tensor(t, "my title") * 2.0, x)
    np.testing.assert_array_equal(y, 2 * x)
    captured = capsys.readouterr()
    assert captured.err == f"my title: {np.array2string(x)}\n" and captured.out == ""


def test_print_tensor_options_and_default_title(capsys):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.arange(3, dtype=np.float32), popxl.float32, "vals")
        p = ops.print_tensor(v, float_format="fixed", digits=2, separator=",",
                             open_bracket="{", close_bracket="}")
        # as upstream: one character each, and a known float format
        with pytest.raises(ValueError, match=r"^Parameter separator must be 1 character exactly\. "
                                             r"Not length 2 and value , \."):
            ops.print_tensor(v, separator=", ")
        with pytest.raises(ValueError, match="^Parameter open_bracket must be 1 character"):
            ops.print_tensor(v, open_bracket="")
        with pytest.raises(KeyError, match="float_format"):
            ops.print_tensor(v, float_format="engineering")
        q = ops.print_tensor(v, print_self=False)
        assert p.name == "print_out" and ir.main_graph._data.ops[-1].type == "PrintTensor"
    with popxl.Session(ir, "ipu_hw") as s:
        capsys.readouterr()
        s.run()
    assert capsys.readouterr().err == "print_vals: {0.00,1.00,2.00}\n"


@pytest.mark.parametrize("print_gradient", [False, True])
def test_print_tensor_gradient(capsys, print_gradient):
    x = np.array([1.0, 2.0])
    dy = np.array([0.5, -1.0])
    _, (dx,) = grads(lambda t: ops.print_tensor(t, "x", print_self=False,
                                                print_gradient=print_gradient) * 3.0, [x], [dy])
    np.testing.assert_array_equal(dx, 3 * dy)
    out = capsys.readouterr().err
    assert out == (f"x_gradient: {np.array2string(3 * dy)}\n" if print_gradient else "")


def test_print_tensor_is_a_side_effect_kept_through_autodiff(capfd):
    """Printed (to fd 2) even when its output is unused; after autodiff the forward prints
    still run and only a print whose output is on the gradient path prints the gradient."""
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(x):
            used = ops.print_tensor(x, "used", print_gradient=True)
            ops.print_tensor(x * 2.0, "unused", print_gradient=True)
            return used * 3.0

        g = ir.create_graph(fn, popxl.TensorSpec((2,), popxl.float32))
        bwd = popxl.transforms.autodiff(g)
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        info = ops.call_with_info(g, x)
        dx, = ops.call(bwd.graph, popxl.constant(np.ones(2, np.float32)),
                       inputs_dict=bwd.inputs_dict(info))
        s = popxl.d2h_stream(dx.shape, dx.dtype)
        ops.host_store(s, dx)
    with popxl.Session(ir, "ipu_hw") as sess:
        capfd.readouterr()
        res = sess.run()
    np.testing.assert_array_equal(res[s], [3.0, 3.0])
    captured = capfd.readouterr()
    assert captured.out == ""
    assert captured.err == ("used: [1. 2.]\nunused: [2. 4.]\nused_gradient: [3. 3.]\n")


def test_ipu_copy_is_identity_named_and_placed():
    ir = popxl.Ir()
    with ir.main_graph:
        with popxl.ipu(0):
            x = popxl.variable(np.ones((2,)), popxl.float32, "x")
            h = x + 1.0
        c = ops.ipu_copy(h, 1)
        d = h.copy_to_ipu(1, 0)
        op = ir.main_graph._data.ops[-2]
    assert op.type == "IpuCopy" and op.attrs["source"] == 0 and op.attrs["destination"] == 1
    assert c.name == f"{h.name}_c1" and c.ipu == 1
    x = np.array([1.0, -2.0], np.float32)
    y, = run_ops(lambda t: ops.ipu_copy(t, 1) * 2.0, x)
    np.testing.assert_array_equal(y, 2 * x)
    with pytest.raises(ValueError, match="destination"):
        with ir.main_graph:
            ops.ipu_copy(h, -1)
    with ir.main_graph:
        # as upstream, a tensor with neither producer nor consumers needs an explicit source
        lone = popxl.variable(np.ones(2), popxl.float32, "lone")
        with pytest.raises(ValueError, match=r'^Could not infer the ipu for Tensor to be copied '
                                             r'".*lone.*" \. Please specify `source`'):
            ops.ipu_copy(lone, 1)
        assert ops.ipu_copy(lone, 1, 0).ipu == 1
        # a variable consumed on an IPU is copied from it
        with popxl.ipu(1):
            used = popxl.variable(np.ones(2), popxl.float32, "used")
            used + 1.0
        assert ir.main_graph._data.ops[-1].type != "IpuCopy"
        ops.ipu_copy(used, 0)
        assert ir.main_graph._data.ops[-1].attrs["source"] == 1
        with pytest.raises(ValueError, match="already on IPU 1"):
            ops.ipu_copy(used, 1)


def test_io_tile_copy_is_identity():
    x = np.array([3.0, 4.0], np.float32)
    y, z = run_ops(lambda t: (ops.io_tile_copy(t), t), x)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("build", [lambda t: ops.ipu_copy(t, 1, 0),
                                   lambda t: ops.io_tile_copy(t)])
def test_copies_stop_the_gradient(build):
    _, (dx,) = grads(lambda t: build(t) + t, [np.array([1.0, 2.0])], [np.array([1.0, 1.0])])
    np.testing.assert_array_equal(dx, [1.0, 1.0])


def test_print_tensor_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros(2), popxl.float32, "x")
        with pytest.raises(ValueError, match="float_format"):
            ops.print_tensor(x, float_format="hex")
        with pytest.raises(TypeError, match="popxl.Tensor"):
            ops.print_tensor(np.zeros(2))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_identity_matches_numpy_and_passes_the_gradient(dtype):
    check_forward(ops.identity, lambda a: a, [(2,)], dtype)
    check_grads(ops.identity, lambda a: a, [(2,)])


def test_cast_truncates_toward_zero():
    out, = run_ops(lambda a: ops.cast(a, popxl.int32), np.array([-1.7, 1.7, 2.5], np.float32))
    np.testing.assert_array_equal(out, [-1, 1, 2])


def test_call_with_an_input_of_another_shape_or_dtype_is_popart_s_setup_error():
    """As upstream (its CallOp setup): a popart_exception, also a ValueError."""
    import popart

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.float32(1), name="a")
        g = ir.create_graph(lambda x: x + 1, a)
        for bad in (popxl.variable(np.float16(1), name="b"),
                    popxl.variable(np.ones(2, np.float32), name="c")):
            with pytest.raises(popart.popart_exception, match=r"^call: input 0 of graph .* "
                                                              r"\('x'\) expects \(\) float32, got"):
                ops.call(g, bad)
            with pytest.raises(ValueError):
                ops.call(g, bad)
