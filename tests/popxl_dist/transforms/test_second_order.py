"""Second-order gradients: autodiff of a graph that calls a forward graph and its gradient
graph, i.e. d<grad(f)(x, dy), ddx>/d(x, dy), through the dedicated grad op types.

For linear ops the gradient is A^T dy, so the second-order gradient w.r.t. dy is the forward op
applied to ddx (and there is none w.r.t. x); activations and conv are checked against their
second derivatives written in NumPy (tests/references.py)."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl.transforms as transforms

import references as ref
from harness import run_ops

F64 = np.float64


def second_order(fn, arrays, dy, ddxs, wrt_inputs=True):
    """(first-order grads, d/d inputs, d/d dy) of sum_i <grad_i f(arrays)(dy), ddx_i>
    (d/d inputs only `wrt_inputs`: a gradient that does not depend on x has none)."""
    ir = popxl.Ir()
    with ir.main_graph:
        specs = [popxl.TensorSpec(a.shape, popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        fwd = ir.create_graph(fn, *specs)
        floats = [t for t in fwd.inputs if t.dtype.is_floating_point]
        bwd = transforms.autodiff(fwd, grads_required=floats)

        def grad_fn(*args):
            info = ops.call_with_info(fwd, *args[:-1])
            return ops.call(bwd.graph, args[-1], inputs_dict=bwd.inputs_dict(info))

        g2 = ir.create_graph(grad_fn, *specs, popxl.TensorSpec(dy.shape, popxl.float64))
        req = [t for t in g2.inputs if t.dtype.is_floating_point] if wrt_inputs else \
            [g2.inputs[-1]]
        bwd2 = transforms.autodiff(g2, grads_provided=g2.outputs[:len(ddxs)],
                                   grads_required=req)
        consts = [popxl.constant(a, popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        info2 = ops.call_with_info(g2, *consts, popxl.constant(dy, popxl.float64))
        first = info2.outputs[:len(ddxs)]
        second = ops.call(bwd2.graph, *[popxl.constant(d, popxl.float64) for d in ddxs],
                          inputs_dict=bwd2.inputs_dict(info2))
        streams = []
        for t in list(first) + list(second):
            streams.append(popxl.d2h_stream(t.shape, t.dtype))
            ops.host_store(streams[-1], t)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
    vals = [res[s] for s in streams]
    n = len(ddxs)
    return vals[:n], vals[n:-1], vals[-1]


LINEAR = [  # (name, fn, input shape); the gradient is linear in dy and independent of x
    ("slice", lambda t: ops.slice(t, [1, 0], [3, 4], axis=[0, 1]), (4, 5)),
    ("subsample", lambda t: ops.subsample(t, [2, 3]), (5, 7)),
    ("cumsum", lambda t: ops.cumsum(t, 1), (3, 4)),
    ("average_pool", lambda t: ops.average_pool(t, (2, 2), stride=(1, 2), padding=(1, 0, 0, 1)),
     (1, 2, 4, 5)),
    ("interpolate", lambda t: ops.interpolate(t, (1, 1, 1.5, 0.75), "cubic"), (1, 1, 4, 4)),
]


@pytest.mark.parametrize("name,fn,shape", LINEAR, ids=[c[0] for c in LINEAR])
def test_second_order_of_linear_grad_ops(name, fn, shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape)
    y, = run_ops(fn, x)
    dy, ddx = rng.normal(size=y.shape), rng.normal(size=shape)
    (dx,), _, d_dy = second_order(fn, [x], dy, [ddx], wrt_inputs=False)
    np.testing.assert_allclose(d_dy, run_ops(fn, ddx)[0], rtol=1e-12, atol=1e-12)
    assert np.abs(dx).max() > 0


def test_second_order_of_gather_and_roi_align():
    rng = np.random.default_rng(1)
    idx = np.array([2, 0, 2, 1], np.int32)
    x = rng.normal(size=(3, 2))
    fn = lambda t, i: ops.gather(t, i)  # noqa: E731
    dy, ddx = rng.normal(size=(4, 2)), rng.normal(size=(3, 2))
    _, _, d_dy = second_order(fn, [x, idx], dy, [ddx], wrt_inputs=False)
    np.testing.assert_allclose(d_dy, ddx[idx], rtol=1e-12)

    rois = np.array([[0.5, 0.5, 3.0, 2.5], [1.0, 0.0, 4.0, 3.0]])
    b = np.array([1, 0], np.int32)
    x = rng.normal(size=(2, 2, 4, 5))
    fn = lambda t, r, i: ops.roi_align(t, r, i, (2, 2), 1.0, 2)  # noqa: E731
    dy, ddx = rng.normal(size=(2, 2, 2, 2)), rng.normal(size=x.shape)
    ir = popxl.Ir()      # only t is differentiable here: grads_required excludes the rois
    with ir.main_graph:
        specs = [popxl.TensorSpec(x.shape, popxl.float64), popxl.TensorSpec(rois.shape,
                                                                             popxl.float64),
                 popxl.TensorSpec(b.shape, popxl.int32)]
        fwd = ir.create_graph(fn, *specs)
        bwd = transforms.autodiff(fwd, grads_required=[fwd.inputs[0]])

        def grad_fn(t, r, i, d):
            info = ops.call_with_info(fwd, t, r, i)
            return ops.call(bwd.graph, d, inputs_dict=bwd.inputs_dict(info))

        g2 = ir.create_graph(grad_fn, *specs, popxl.TensorSpec(dy.shape, popxl.float64))
        bwd2 = transforms.autodiff(g2, grads_required=[g2.inputs[3]])
        info2 = ops.call_with_info(g2, popxl.constant(x, popxl.float64),
                                   popxl.constant(rois, popxl.float64), popxl.constant(b),
                                   popxl.constant(dy, popxl.float64))
        d_dy, = ops.call(bwd2.graph, popxl.constant(ddx, popxl.float64),
                         inputs_dict=bwd2.inputs_dict(info2))
        s = popxl.d2h_stream(d_dy.shape, d_dy.dtype)
        ops.host_store(s, d_dy)
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()[s]
    np.testing.assert_allclose(got, run_ops(fn, ddx, rois, b)[0], rtol=1e-12)


def _elementwise_double_backward(d1, d2, x, dy, ddx):
    """(first-order grads, d/dx, d/d dy) of <f'(x) dy, ddx> for an elementwise f with first
    and second derivatives d1, d2."""
    return [d1(x) * dy], [d2(x) * dy * ddx], d1(x) * ddx


def _softmax_double_backward(x, dy, ddx):
    """The same for softmax over axis 1: g = y (dy - <dy, y>) and T = <g, ddx> =
    <y dy, ddx> - <dy, y><y, ddx> per row; dT/dy_m = ddx_m dy_m - dy_m <y, ddx> - ddx_m <dy, y>,
    pulled back through y = softmax(x) (the softmax VJP), and dT/d dy = y (ddx - <y, ddx>)."""
    y = ref.softmax(x, 1)

    def vjp(a):
        return y * (a - np.sum(a * y, 1, keepdims=True))
    s, r = np.sum(dy * y, 1, keepdims=True), np.sum(ddx * y, 1, keepdims=True)
    return [vjp(dy)], [vjp(ddx * dy - dy * r - ddx * s)], y * (ddx - r)


def _inside(lo, hi):
    return lambda x: ((x > lo) & (x < hi)).astype(F64)


ACTIVATIONS = [  # (name, popxl fn, first derivative, second derivative)
    ("tanh", ops.tanh, lambda x: 1 - np.tanh(x) ** 2,
     lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    ("relu", ops.relu, lambda x: (x > 0).astype(F64), np.zeros_like),
    ("gelu_tanh", ops.gelu, lambda x: ref.gelu_tanh(x, 1), lambda x: ref.gelu_tanh(x, 2)),
    ("gelu_erf", ops.geluerf, lambda x: ref.gelu_erf(x, 1), lambda x: ref.gelu_erf(x, 2)),
    ("clip", lambda t: ops.clip(t, -0.5, 0.7), _inside(-0.5, 0.7), np.zeros_like),
    ("softmax", lambda t: ops.softmax(t, 1), None, None),
]


@pytest.mark.parametrize("name,fn,d1,d2", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_second_order_of_activation_grads_matches_reference(name, fn, d1, d2):
    rng = np.random.default_rng(2)
    x, dy, ddx = (rng.normal(size=(3, 4)) for _ in range(3))
    want = _softmax_double_backward(x, dy, ddx) if name == "softmax" else \
        _elementwise_double_backward(d1, d2, x, dy, ddx)
    got = second_order(fn, [x], dy, [ddx])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.squeeze(np.asarray(g)), np.squeeze(np.asarray(w)),
                                   rtol=1e-7, atol=1e-9)


def test_second_order_of_conv_matches_reference():
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(2, 4, 5, 4)), rng.normal(size=(4, 2, 2, 3))
    kw = dict(stride=(2, 1), padding=(1, 0, 0, 1), groups=2)
    fn = lambda a, b: ops.conv(a, b, **kw)  # noqa: E731
    y, = run_ops(fn, x, w)
    dy, ddx, ddw = rng.normal(size=y.shape), rng.normal(size=x.shape), rng.normal(size=w.shape)

    def conv(a, b):
        return ref.conv(a, b, stride=(2, 1), pads=(1, 0, 0, 1), groups=2)

    # conv is bilinear: the first-order grads are J_x^T dy and J_w^T dy, and
    # T = <dx, ddx> + <dw, ddw> = <dy, conv(ddx, w) + conv(x, ddw)>, so
    # dT/d dy = conv(ddx, w) + conv(x, ddw), dT/dx = J_x(ddw)^T dy, dT/dw = J_w(ddx)^T dy.
    first = [ref.linear_vjp(lambda a: conv(a, w), x.shape, dy),
             ref.linear_vjp(lambda b: conv(x, b), w.shape, dy)]
    second = [ref.linear_vjp(lambda a: conv(a, ddw), x.shape, dy),
              ref.linear_vjp(lambda b: conv(ddx, b), w.shape, dy)]
    want = first, second, conv(ddx, w) + conv(x, ddw)
    got = second_order(fn, [x, w], dy, [ddx, ddw])
    for part_g, part_w in zip(got, want):
        for g, w_ in zip(part_g if isinstance(part_g, list) else [part_g],
                         part_w if isinstance(part_w, list) else [part_w]):
            np.testing.assert_allclose(g, w_, rtol=1e-9, atol=1e-9)


def test_second_order_through_a_grad_op_without_rule_names_it():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2, 3), popxl.float32)
        fwd = ir.create_graph(lambda t: ops.swish(t), spec)
        bwd = transforms.autodiff(fwd)
        with pytest.raises(NotImplementedError, match="'SwishGrad' has a gradient op whose own "
                                                      "gradient"):
            transforms.autodiff(bwd.graph)
