"""NN ops: group/layer/batch norm, nll_loss, dropout, conv and pooling against NumPy references
(written here and in tests/references.py; conv and pooling follow PyTorch's conv2d / max_pool2d /
avg_pool2d), gradients against finite differences (float64), op types and builder errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

import references as ref
from harness import grads, numeric_grads, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


def _group_norm_ref(x, w, b, groups, eps):
    n = x.shape[0]
    xg = x.reshape(n, groups, -1).astype(F64)
    mean = xg.mean(axis=2, keepdims=True)
    var = xg.var(axis=2, keepdims=True)          # biased
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    cs = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return y * w.reshape(cs) + b.reshape(cs)


def _bn_ref(x, s, b, m, v, eps):
    cs = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return s.reshape(cs) * (x - m.reshape(cs)) / np.sqrt(v.reshape(cs) + eps) + b.reshape(cs)


# (name, builder, reference, input shapes) for the normalisations.
NORMS = [
    ("group_norm_2groups", lambda x, w, b: ops.group_norm(x, w, b, 2, eps=1e-3),
     lambda x, w, b: _group_norm_ref(x, w, b, 2, 1e-3), [(2, 4, 3), (4,), (4,)]),
    ("group_norm_4d", lambda x, w, b: ops.group_norm(x, w, b, 3),
     lambda x, w, b: _group_norm_ref(x, w, b, 3, 1e-5), [(2, 3, 2, 2), (3,), (3,)]),
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b),
     lambda x, w, b: _group_norm_ref(x, w, b, 1, 1e-5), [(3, 4, 2), (4,), (4,)]),
    ("layer_norm_2d", lambda x, w, b: ops.layer_norm(x, w, b, eps=1e-2),
     lambda x, w, b: _group_norm_ref(x, w, b, 1, 1e-2), [(2, 3), (3,), (3,)]),
    ("batch_norm_inference",
     lambda x, s, b, m, v: ops.batch_norm_inference(x, s, b, m, v, epsilon=1e-3),
     lambda x, s, b, m, v: _bn_ref(x, s, b, m, v, 1e-3), [(2, 3, 2), (3,), (3,), (3,), (3,)]),
]


def _inputs(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrs = [rng.normal(size=s).astype(dtype) for s in shapes]
    if len(arrs) == 5:
        arrs[4] = (np.abs(arrs[4]) + 0.5).astype(dtype)       # a positive variance
    return arrs


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("name,build,ref,shapes", NORMS, ids=[r[0] for r in NORMS])
def test_norms_match_numpy(name, build, ref, shapes, dtype):
    arrs = _inputs(shapes, dtype)
    out, = run_ops(build, *arrs)
    assert out.dtype == dtype and out.shape == shapes[0]
    tol = 5e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(out, ref(*(a.astype(F64) for a in arrs)), rtol=tol, atol=tol)


def test_group_norm_three_groups_keyword_arguments():
    x, w, b = _inputs([(2, 6, 5), (6,), (6,)], F32, seed=3)
    out, = run_ops(lambda *t: ops.group_norm(*t, num_groups=3, eps=1e-4), x, w, b)
    want = _group_norm_ref(x, w.astype(F64), b.astype(F64), 3, 1e-4)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,build,ref,shapes", NORMS, ids=[r[0] for r in NORMS])
def test_norm_grads_match_finite_differences(name, build, ref, shapes):
    arrs = _inputs(shapes, F64, seed=5)
    dy = np.random.default_rng(6).normal(size=shapes[0])
    _, got = grads(build, arrs, [dy])
    want = numeric_grads(build, arrs, [dy])
    assert len(got) == len(arrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_group_norm_op_structure():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4, 3)), popxl.float32, "x")
        w = popxl.variable(np.ones((4,)), popxl.float32, "w")
        b = popxl.variable(np.zeros((4,)), popxl.float32, "b")
        y = ops.group_norm(x, w, b, 2)
        op = ir.main_graph._data.ops[-1]
    assert op.type == "GroupNormalization" and len(op.outputs) == 3
    assert op.outputs[0] == y.id
    assert [ir.main_graph._data.tensors[t].shape for t in op.outputs[1:]] == [(4,), (4,)]


def _nll_ref(p, lab, ignore, reduction, log_prob):
    eps = 6.104e-5 if p.dtype == F16 else 1e-7
    pf = p.reshape(-1, p.shape[-1]).astype(F64)
    lf = lab.reshape(-1)
    valid = np.ones(lf.shape, bool) if ignore is None else lf != ignore
    picked = pf[np.arange(lf.size), np.where(valid, lf, 0)]
    loss = -picked if log_prob else -np.log(np.maximum(picked, eps))
    loss = np.where(valid, loss, 0)
    if reduction == "none":
        return loss.reshape(lab.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / max(valid.sum(), 1)


NLL_CASES = [
    ("mean", None, False), ("sum", None, False), ("none", None, False),
    ("mean", 2, False), ("none", 1, False), ("mean", None, True), ("sum", 0, True),
]


def _probs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    e = np.exp(rng.normal(size=shape))
    return (e / e.sum(axis=-1, keepdims=True)).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("reduction,ignore,log_prob", NLL_CASES)
def test_nll_loss_matches_numpy(reduction, ignore, log_prob, dtype):
    p = _probs((2, 3, 4), dtype)
    p[0, 0, 1] = 0                                  # clamped by eps
    lab = np.array([[1, 2, 3], [2, 0, 2]], np.int32)
    out, = run_ops(lambda a, b: ops.nll_loss(a, b, ignore, reduction, log_prob), p, lab)
    want = _nll_ref(p, lab, ignore, reduction, log_prob)
    assert out.shape == np.shape(want) and out.dtype == dtype
    tol = 2e-3 if dtype == F16 else 1e-6
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("reduction,ignore,log_prob", NLL_CASES)
def test_nll_loss_grad_matches_finite_differences(reduction, ignore, log_prob):
    p = _probs((3, 4), F64, seed=1)
    lab = np.array([2, 0, 2], np.int32)
    fn = lambda a, b: ops.nll_loss(a, b, ignore, reduction, log_prob)  # noqa: E731
    dy = np.array(1.5) if reduction != "none" else np.array([0.5, -1.0, 2.0])
    _, got = grads(fn, [p, lab], [dy])
    want = numeric_grads(fn, [p, lab], [dy])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)


def _seed(a=1, b=2):
    return np.array([a, b], np.uint32)


def test_dropout_mask_scale_and_determinism():
    x = np.ones((64, 64), F32)
    y1, y2, y3 = run_ops(lambda t, s, s2: (ops.dropout(t, s, 0.25), ops.dropout(t, s, 0.25),
                                            ops.dropout(t, s2, 0.25)), x, _seed(), _seed(3, 4))
    assert set(np.unique(y1)) == {0.0, np.float32(1 / 0.75)}
    assert abs((y1 == 0).mean() - 0.25) < 0.03
    np.testing.assert_array_equal(y1, y2)                 # same seed, same mask
    assert (y1 != y3).any()                               # another seed, another mask
    y0, = run_ops(lambda t, s: ops.dropout(t, s, 0.0), x, _seed())
    np.testing.assert_array_equal(y0, x)


def test_dropout_grad_uses_the_forward_mask():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8))
    dy = rng.normal(size=(8, 8))
    outs, (dx,) = grads(lambda t, s: ops.dropout(t, s, 0.5), [x, _seed(7, 9)], [dy])
    mask = outs[0] / x                                    # 0 or 2 elementwise
    np.testing.assert_allclose(dx, dy * mask, rtol=1e-12)
    assert (mask == 0).any() and (mask != 0).any()


def test_shaped_dropout_drops_whole_rows():
    x = np.ones((32, 6), F32)
    y, = run_ops(lambda t, s: ops.shaped_dropout(t, s, (32, 1), 0.5), x, _seed())
    rows = y[:, 0]
    assert (y == rows[:, None]).all() and set(np.unique(rows)) == {0.0, 2.0}
    rng = np.random.default_rng(1)
    xx, dy = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    outs, (dx,) = grads(lambda t, s: ops.shaped_dropout(t, s, (4, 1), 0.5), [xx, _seed()], [dy])
    np.testing.assert_allclose(dx, dy * (outs[0] / xx), rtol=1e-12)


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, s, lab: ops.group_norm(x, w, w, 3), ValueError, "num_groups 3"),
    (lambda x, w, s, lab: ops.layer_norm(x, x, x), ValueError, r"must have shape \(4,\)"),
    (lambda x, w, s, lab: ops.layer_norm(x, ops.cast(w, popxl.float16), w), TypeError,
     "same dtype"),
    (lambda x, w, s, lab: ops.batch_norm_inference(x, w, w, w, x), ValueError, "var"),
    (lambda x, w, s, lab: ops.nll_loss(x, lab, reduction="avg"), ValueError, "reduction"),
    (lambda x, w, s, lab: ops.nll_loss(x, x), TypeError, "integer class ids"),
    (lambda x, w, s, lab: ops.nll_loss(w, lab), ValueError, "do not match"),
    (lambda x, w, s, lab: ops.dropout(x, lab, 0.1), ValueError, r"uint32 of shape \(2,\)"),
    (lambda x, w, s, lab: ops.dropout(x, s, 1.0), ValueError, r"\[0, 1\)"),
    (lambda x, w, s, lab: ops.shaped_dropout(x, s, (3, 1), 0.5), ValueError, "broadcast"),
])
def test_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4)), popxl.float32, "x")
        w = popxl.variable(np.zeros((4,)), popxl.float32, "w")
        s = popxl.variable(_seed(), popxl.uint32, "s")
        lab = popxl.variable(np.zeros((2,)), popxl.int32, "lab")
        with pytest.raises(err, match=match):
            build(x, w, s, lab)


# --- conv and pooling -------------------------------------------------------------------------

# (name, kwargs, x shape, w shape)
CONVS = [
    ("plain_2d", dict(), (2, 3, 5, 5), (4, 3, 3, 3)),
    ("stride_pad_dilation_groups", dict(stride=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2),
                                        groups=2), (2, 4, 5, 6), (6, 2, 3, 2)),
    ("conv_1d", dict(stride=(2,), padding=(1, 2), dilation=(1,)), (2, 3, 7), (2, 3, 3)),
    ("depthwise", dict(padding=(1, 1, 1, 1), groups=3), (1, 3, 4, 4), (3, 1, 3, 3)),
]


@pytest.mark.parametrize("name,kw,xs,ws", CONVS, ids=[c[0] for c in CONVS])
def test_conv_matches_reference(name, kw, xs, ws):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=xs).astype(F32), rng.normal(size=ws).astype(F32)
    y, = run_ops(lambda a, b: ops.conv(a, b, **kw), x, w)
    want = ref.conv(x, w, kw.get("stride"), kw.get("padding"), kw.get("dilation"),
                    kw.get("groups", 1))
    assert y.shape == want.shape and np.abs(y).max() > 0
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,kw,xs,ws", CONVS[:2], ids=[c[0] for c in CONVS[:2]])
def test_float16_conv_rounds_the_float32_result_once(name, kw, xs, ws):
    # values down to float16's subnormal range: the kernels' fast float16 converters must give
    # NumPy's cast bits on the way in and out
    rng = np.random.default_rng(4)
    x = (rng.normal(size=xs) * np.exp2(rng.integers(-22, 4, size=xs))).astype(F16)
    w = rng.normal(size=ws).astype(F16)
    y16, = run_ops(lambda a, b: ops.conv(a, b, **kw), x, w)
    y32, = run_ops(lambda a, b: ops.conv(a, b, **kw), x.astype(F32), w.astype(F32))
    assert y16.dtype == F16
    np.testing.assert_array_equal(y16.view(np.uint16), y32.astype(F16).view(np.uint16))
    want = ref.conv(x.astype(F64), w.astype(F64), kw.get("stride"), kw.get("padding"),
                    kw.get("dilation"), kw.get("groups", 1))
    np.testing.assert_allclose(y16, want, rtol=2e-3, atol=2e-3)


def test_float16_batch_norm_rounds_the_float32_result_once():
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(2, 3, 4, 5)) * np.exp2(rng.integers(-22, 4, size=(2, 3, 4, 5))))
    s, b, m = (rng.normal(size=3) * 1e-3 for _ in range(3))
    v = np.abs(rng.normal(size=3)) + 0.5
    arrs16 = [a.astype(F16) for a in (x, s, b, m, v)]
    build = lambda *t: ops.batch_norm_inference(*t, epsilon=1e-3)  # noqa: E731
    y16, = run_ops(build, *arrs16)
    a32 = [a.astype(F32) for a in arrs16]
    k = a32[1] / np.sqrt(a32[4] + F32(1e-3))
    cs = (1, 3, 1, 1)
    want = ((a32[0] - a32[3].reshape(cs)) * k.reshape(cs) + a32[2].reshape(cs)).astype(F16)
    assert y16.dtype == F16
    np.testing.assert_array_equal(y16.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("pad_type", ["same_upper", "same_lower", "valid"])
def test_conv_pad_types(pad_type):
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(1, 1, 5)).astype(F32), rng.normal(size=(1, 1, 2)).astype(F32)
    y, = run_ops(lambda a, b: ops.conv(a, b, stride=(2,), pad_type=pad_type), x, w)
    # out = ceil(5/2) = 3 needs a total pad of 1: at the end (upper) or the start (lower)
    pad = {"same_upper": (0, 1), "same_lower": (1, 0), "valid": (0, 0)}[pad_type]
    xp = np.pad(x[0, 0], pad)
    want = np.array([xp[i:i + 2] @ w[0, 0] for i in range(0, len(xp) - 1, 2)])
    np.testing.assert_allclose(y[0, 0], want, rtol=1e-6)


POOLS = [
    ("max", lambda t: ops.max_pool(t, (2, 3), stride=(2, 2), padding=(1, 1, 1, 1))),
    ("max_dilated", lambda t: ops.max_pool(t, (2, 2), stride=(1, 1), dilation=(2, 1))),
    ("avg", lambda t: ops.average_pool(t, (3, 3), stride=(2, 2), padding=(1, 1, 1, 1))),
    ("avg_ceil", lambda t: ops.average_pool(t, (2, 2), stride=(2, 2), ceil_mode=True)),
    ("max_in_dil_out_pads", lambda t: ops.max_pool(t, (2, 2), stride=(1, 2), padding=(1, 0, 0, 1),
                                                   in_dilations=(2, 1), out_pads=(1, 0, 0, 2))),
    ("avg_in_dil_out_pads", lambda t: ops.average_pool(t, (3, 2), stride=(2, 1),
                                                       padding=(1, 1, 1, 1), in_dilations=(1, 3),
                                                       out_pads=(0, 1, 2, 0))),
]


def _dilate_zeros(x, dil):
    """The input transform of in_dilations: d-1 zero cells between neighbours."""
    shape = x.shape[:2] + tuple(d * (s - 1) + 1 for d, s in zip(dil, x.shape[2:]))
    out = np.zeros(shape, x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dil)] = x
    return out


def _pool_ref(name, x):
    """The POOLS cases as PyTorch defines them (max_pool2d; avg_pool2d without the padding in
    the count), in NumPy."""
    if name == "max":
        return ref.pool2d(x, "max", (2, 3), (2, 2), (1, 1, 1, 1))
    if name == "max_dilated":
        return ref.pool2d(x, "max", (2, 2), (1, 1), dilation=(2, 1))
    if name == "avg":
        return ref.pool2d(x, "avg", (3, 3), (2, 2), (1, 1, 1, 1))
    if name == "max_in_dil_out_pads":
        y = ref.pool2d(_dilate_zeros(x, (2, 1)), "max", (2, 2), (1, 2), (1, 0, 0, 1))
        return np.pad(y, [(0, 0), (0, 0), (1, 0), (0, 2)])
    if name == "avg_in_dil_out_pads":
        y = ref.pool2d(_dilate_zeros(x, (1, 3)), "avg", (3, 2), (2, 1), (1, 1, 1, 1))
        return np.pad(y, [(0, 0), (0, 0), (0, 2), (1, 0)])
    return ref.pool2d(x, "avg", (2, 2), (2, 2), ceil_mode=True)


@pytest.mark.parametrize("name,build", POOLS, ids=[p[0] for p in POOLS])
def test_pools_match_reference(name, build):
    x = np.random.default_rng(2).normal(size=(2, 3, 5, 6)).astype(F32)
    y, = run_ops(build, x)
    want = _pool_ref(name, x)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


GRAD_CASES = [(c[0], lambda a, b, kw=c[1]: ops.conv(a, b, **kw), [(1, c[2][1]) + c[2][2:], c[3]])
              for c in CONVS[1:3]]
GRAD_CASES += [(p[0], p[1], [(1, 2, 4, 5)]) for p in POOLS]


@pytest.mark.parametrize("name,build,shapes", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_conv_pool_grads_match_finite_differences(name, build, shapes):
    rng = np.random.default_rng(3)
    arrs = [rng.normal(size=s) for s in shapes]
    out = run_ops(build, *arrs)[0]
    dy = rng.normal(size=out.shape)
    _, got = grads(build, arrs, [dy])
    want = numeric_grads(build, arrs, [dy])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w: ops.conv(x, w, groups=2), ValueError, "groups 2"),
    (lambda x, w: ops.conv(x, w, padding=(1, 1)), ValueError,
     "'padding' must have 4 entries"),
    (lambda x, w: ops.conv(x, w, pad_type="same"), ValueError, "pad type"),
    (lambda x, w: ops.conv(x, ops.reshape(w, (2, 3, 4, 1))), ValueError, "larger than"),
    (lambda x, w: ops.max_pool(x, (2,)), ValueError, "kernel_size"),
    (lambda x, w: ops.average_pool(x, (2, 2), in_dilations=(0, 1)), ValueError,
     "in_dilations"),
    (lambda x, w: ops.max_pool(x, (2, 2), out_pads=(1, 1)), ValueError,
     "'out_pads' must have 4 entries"),
])
def test_conv_pool_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((1, 3, 3, 3)), popxl.float32, "x")
        w = popxl.variable(np.zeros((2, 3, 2, 2)), popxl.float32, "w")
        with pytest.raises(err, match=match):
            build(x, w)
