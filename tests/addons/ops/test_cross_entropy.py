"""addons.ops.cross_entropy(_with_grad) against NumPy."""
import numpy as np
import pytest

import popxl
import popxl_addons as addons


def _numpy_ce(x, labels, scale, ignore_index, reduction):
    x = x.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    flat_p, flat_l = p.reshape(-1, p.shape[-1]), labels.reshape(-1)
    keep = np.ones_like(flat_l, bool) if ignore_index is None else flat_l != ignore_index
    nll = np.where(keep, -np.log(flat_p[np.arange(len(flat_l)), np.where(keep, flat_l, 0)]), 0)
    onehot = np.eye(p.shape[-1])[np.where(keep, flat_l, 0)]
    dx = (flat_p - onehot) * keep[:, None] * scale
    if reduction == "mean":
        n = max(int(keep.sum()), 1)
        return nll.sum() / n, (dx / n).reshape(x.shape)
    return nll.sum(), dx.reshape(x.shape)


# (logits shape, loss_scaling, ignore_index, reduction)
CASES = [((8, 10), 1, None, "mean"), ((8, 10), 64.0, None, "mean"), ((6, 5), 2.0, 3, "mean"),
         ((6, 5), 1, 3, "sum"), ((2, 3, 4), 1.0, None, "mean"), ((4, 3), 1, 1, "mean")]


@pytest.mark.parametrize("shape, scale, ignore, reduction", CASES)
def test_cross_entropy_with_grad(shape, scale, ignore, reduction):
    rng = np.random.default_rng(len(shape) * 10 + shape[-1])
    x0 = rng.normal(size=shape).astype(np.float32)
    l0 = rng.integers(0, shape[-1], size=shape[:-1]).astype(np.int32)
    if ignore is not None:
        l0.reshape(-1)[::2] = ignore
    ir = popxl.Ir()
    with ir.main_graph:
        x, labels = popxl.variable(x0), popxl.variable(l0)
        loss, dx = addons.ops.cross_entropy_with_grad(x, labels, scale, ignore, reduction)
        loss2 = addons.cross_entropy(x, labels, ignore, reduction)
        s_loss, s_dx, s_loss2 = (addons.host_store(t) for t in (loss, dx, loss2))
    with popxl.Session(ir, "ipu_hw") as s:
        out = s.run()
    want_loss, want_dx = _numpy_ce(x0, l0, scale, ignore, reduction)
    np.testing.assert_allclose(out[s_loss], want_loss, rtol=1e-5)   # loss NOT scaled
    np.testing.assert_allclose(out[s_loss2], want_loss, rtol=1e-5)
    np.testing.assert_allclose(out[s_dx], want_dx, rtol=1e-4, atol=1e-6)  # dx IS scaled


def test_loss_scaling_tensor_and_host_load():
    ir = popxl.Ir()
    with ir.main_graph:
        arr, stream, t = addons.host_load(np.zeros((4, 3)), popxl.float32, "x")
        assert arr.dtype == np.float32 and stream.shape == (4, 3) and t.shape == (4, 3)
        labels = popxl.variable(np.array([0, 1, 2, 0], np.int32))
        loss, dx = addons.ops.cross_entropy_with_grad(t, labels, popxl.constant(4.0))
        out = addons.host_store(dx)
        assert out.tensor_id.endswith("_stream")
    with popxl.Session(ir, "ipu_hw") as s:
        got = s.run({stream: arr})[out]
    want = _numpy_ce(arr, np.array([0, 1, 2, 0]), 4.0, None, "mean")[1]
    np.testing.assert_allclose(got, want, rtol=1e-5)
