"""Second-order gradients: autodiff of a graph that calls a forward graph and its gradient
graph, i.e. d<grad(f)(x, dy), ddx>/d(x, dy), through the dedicated grad op types.

For linear ops the gradient is A^T dy, so the second-order gradient w.r.t. dy is the forward op
applied to ddx (and there is none w.r.t. x); activations and conv are checked against torch's double
backward."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl.transforms as transforms

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


def _torch_double_backward(torch_fn, arrays, dy, ddxs):
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    dyt = torch.tensor(dy, requires_grad=True)
    out = torch_fn(*ts)
    grads = torch.autograd.grad(out, ts, dyt, create_graph=True)
    total = sum((g * torch.tensor(d)).sum() for g, d in zip(grads, ddxs))
    second = torch.autograd.grad(total, ts + [dyt], allow_unused=True)
    as_np = [np.zeros(a.shape) if s is None else s.detach().numpy()
             for a, s in zip(arrays + [dy], second)]
    return [g.detach().numpy() for g in grads], as_np[:-1], as_np[-1]


ACTIVATIONS = [  # (name, popxl fn, torch fn name, kwargs)
    ("tanh", ops.tanh, "tanh", {}),
    ("relu", ops.relu, "relu", {}),
    ("gelu_tanh", ops.gelu, "gelu", {"approximate": "tanh"}),
    ("gelu_erf", ops.geluerf, "gelu", {}),
    ("clip", lambda t: ops.clip(t, -0.5, 0.7), "clamp", {"min": -0.5, "max": 0.7}),
    ("softmax", lambda t: ops.softmax(t, 1), "softmax", {"dim": 1}),
]


@pytest.mark.parametrize("name,fn,tname,kw", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_second_order_of_activation_grads_matches_torch(name, fn, tname, kw):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, dy, ddx = (rng.normal(size=(3, 4)) for _ in range(3))
    tfn = getattr(torch, tname) if hasattr(torch, tname) else getattr(torch.nn.functional, tname)
    if tname == "gelu":
        tfn = torch.nn.functional.gelu
    want = _torch_double_backward(lambda t: tfn(t, **kw), [x], dy, [ddx])
    got = second_order(fn, [x], dy, [ddx])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.squeeze(np.asarray(g)), np.squeeze(np.asarray(w)),
                                   rtol=1e-7, atol=1e-9)


def test_second_order_of_conv_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(2, 4, 5, 4)), rng.normal(size=(4, 2, 2, 3))
    kw = dict(stride=(2, 1), padding=(1, 0, 0, 1), groups=2)
    fn = lambda a, b: ops.conv(a, b, **kw)  # noqa: E731
    y, = run_ops(fn, x, w)
    dy, ddx, ddw = rng.normal(size=y.shape), rng.normal(size=x.shape), rng.normal(size=w.shape)

    def tfn(a, b):
        a = torch.nn.functional.pad(a, (0, 1, 1, 0))
        return torch.nn.functional.conv2d(a, b, stride=(2, 1), groups=2)

    want = _torch_double_backward(tfn, [x, w], dy, [ddx, ddw])
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
