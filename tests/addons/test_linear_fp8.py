"""LinearFP8: forward and hand-written gradients against a NumPy model of the float8 recipe
(per-tensor amax / mse / manual scales, float8_143 forward, float8_152 gradients), and a short
training run."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.fp8_utils import host_pow2scale_cast_from_fp8 as dec
from popxl.fp8_utils import host_pow2scale_cast_to_fp8 as enc
from popxl_addons.layers.linear_fp8 import LinearFP8

from fp8_reference import ref_device_scale

F143, F152 = popxl.float8_143, popxl.float8_152
FMT_MAX = {F143: 240.0, F152: 57344.0}


def scale_of(a, dtype, metric, manual=0):
    if metric == "manual_scale":
        s = manual
    elif metric == "mse":
        s = ref_device_scale(a, dtype)
    else:
        s = np.clip(np.floor(np.log2(FMT_MAX[dtype] / np.abs(a.astype(np.float64)).max())),
                    -31, 31)
    return int(np.clip(s, -16, 15))


def cast8(a, dtype, metric, manual=0):
    s = scale_of(a, dtype, metric, manual)
    return dec(enc(a, dtype, s), popxl.float64), s


def reference(x, w, b, dy, metric, manual=0):
    """(y, dx, dw, db) of the float8 recipe computed here."""
    dt = x.dtype
    x8, sx = cast8(x, F143, metric, manual)
    w8, sw = cast8(w, F143, metric, manual)
    y = (x8 @ w8 * 2.0 ** -(sx + sw)).astype(np.float16).astype(dt) + b
    g8, sg = cast8(dy, F152, metric, manual)
    dx = (g8 @ w8.T * 2.0 ** -(sg + sw)).astype(np.float16).astype(dt)
    dw = (x8.reshape(-1, x.shape[-1]).T @ g8.reshape(-1, dy.shape[-1])
          * 2.0 ** -(sx + sg)).astype(np.float16).astype(dt)
    return y, dx, dw, dy.reshape(-1, dy.shape[-1]).sum(0)


def run_layer(layer, x, dy):
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = layer.create_graph(popxl.TensorSpec(x.shape, popxl.dtype.as_dtype(x.dtype)))
        bwd = fwd.autodiff()
        v = facts.init()
        info = fwd.bind(v).call_with_info(popxl.constant(x))
        dinfo = bwd.call_with_info(popxl.constant(dy),
                                   args=bwd.grad_graph_info.inputs_dict(info))
        g = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, dinfo)
        xin = info.parent_input(0)
        streams = [addons.host_store(t) for t in
                   (info.outputs[0], g[xin], g[v.weight], g[v.bias])]
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()
        w, b = sess.get_tensor_data(v.weight).copy(), sess.get_tensor_data(v.bias).copy()
    return [out[s] for s in streams], w, b


@pytest.mark.parametrize("metric,manual", [("amax", 0), ("mse", 0), ("manual_scale", 4)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_linear_fp8_forward_and_grads_match_numpy(metric, manual, dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 8)).astype(dtype)
    dy = (rng.normal(size=(2, 3, 5)) * 1e-3).astype(dtype)
    np.random.seed(0)
    (y, dx, dw, db), w, b = run_layer(LinearFP8(5, scale_metric=metric, scale=manual), x, dy)
    want = reference(x, w.astype(np.float64), b.astype(np.float64), dy, metric, manual)
    for name, got, ref in zip(("y", "dx", "dw", "db"), (y, dx, dw, db), want):
        assert got.dtype == dtype and got.shape == ref.shape, name
        np.testing.assert_allclose(got, ref.astype(dtype), rtol=2e-3, atol=1e-6, err_msg=name)
    # and it is a linear layer, to float8 precision
    exact = x.astype(np.float64) @ w + b
    assert np.abs(y - exact).max() < 0.15 * np.abs(exact).max()


def test_linear_fp8_trains():
    """SGD on a toy regression: the float8 layer's loss falls like the float32 layer's."""
    rng = np.random.default_rng(1)
    w_true = rng.normal(size=(6, 3)).astype(np.float32)
    xs = rng.normal(size=(16, 6)).astype(np.float32)
    ys = xs @ w_true

    class Step(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc = LinearFP8(3, bias=False)

        def build(self, x, y):
            out, = self.call_module(self.fc, "fc")(x)
            d = out - y
            return ops.mean(d * d)

    ir = popxl.Ir()
    with ir.main_graph:
        facts, g = Step().create_graph(popxl.TensorSpec(xs.shape, popxl.float32),
                                       popxl.TensorSpec(ys.shape, popxl.float32))
        bwd = addons.autodiff(g, grads_required=[g.args.fc.weight])
        v = facts.init()
        x_t, y_t = popxl.constant(xs), popxl.constant(ys)
        info = g.bind(v).call_with_info(x_t, y_t)
        dinfo = bwd.call_with_info(popxl.constant(np.float32(1.0)),
                                   args=bwd.grad_graph_info.inputs_dict(info))
        dw = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, dinfo)[v.fc.weight]
        ops.scaled_add_(v.fc.weight, dw, b=-0.05)
        loss = addons.host_store(info.outputs[0])
    losses = []
    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(60):
            losses.append(float(sess.run()[loss]))
    assert losses[-1] < 0.05 * losses[0], losses[::10]
