"""conv, conv_transpose and pooling against NumPy references (conv and pooling follow PyTorch's
conv2d / max_pool2d / avg_pool2d in tests/references.py; conv_transpose a scalar loop following
the ONNX definition written here), gradients against finite differences (float64), op types and
builder errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

import references as ref
from harness import check_image_builder_error, grads, numeric_grads, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


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


# --- conv_transpose -----------------------------------------------------------------------
def conv_transpose_ref(x, w, stride, pads, dilation, groups, output_padding):
    """ONNX ConvTranspose by scattering every input cell through the kernel."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    nd = len(sp)
    k = w.shape[2:]
    mg = w.shape[1]
    full = [stride[d] * (sp[d] - 1) + output_padding[d] + (k[d] - 1) * dilation[d] + 1
            for d in range(nd)]
    y = np.zeros((n, mg * groups) + tuple(full))
    cg = c // groups
    for b in range(n):
        for ci in range(c):
            g = ci // cg
            for i in np.ndindex(*sp):
                for kk in np.ndindex(*k):
                    pos = tuple(i[d] * stride[d] + kk[d] * dilation[d] for d in range(nd))
                    for m in range(mg):
                        y[(b, g * mg + m) + pos] += x[(b, ci) + i] * w[(ci, m) + kk]
    crop = tuple(slice(pads[d], full[d] - pads[nd + d]) for d in range(nd))
    return y[(slice(None), slice(None)) + crop]


TRANSPOSES = [  # (name, kwargs, x shape, w shape)
    ("plain_2d", {}, (2, 3, 4, 5), (3, 2, 3, 3)),
    ("stride_pad_outpad", dict(stride=(2, 3), padding=(1, 1, 1, 1), output_padding=(1, 2)),
     (1, 2, 3, 4), (2, 3, 2, 3)),
    ("groups_dilation", dict(groups=2, dilation=(2, 1), stride=(1, 2)), (2, 4, 3, 3),
     (4, 1, 2, 2)),
    ("1d", dict(stride=(3,), padding=(2, 2)), (2, 2, 5), (2, 3, 4)),
]


@pytest.mark.parametrize("name,kw,xs,ws", TRANSPOSES, ids=[t[0] for t in TRANSPOSES])
def test_conv_transpose_matches_reference(name, kw, xs, ws):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=xs).astype(F32), rng.normal(size=ws).astype(F32)
    y, = run_ops(lambda a, b: ops.conv_transpose(a, b, **kw), x, w)
    nd = len(xs) - 2
    want = conv_transpose_ref(x.astype(F64), w.astype(F64), kw.get("stride", (1,) * nd),
                              kw.get("padding", (0,) * 2 * nd), kw.get("dilation", (1,) * nd),
                              kw.get("groups", 1), kw.get("output_padding", (0,) * nd))
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw,pads", [
    (dict(padding=(0, 2, 1, 0)), (0, 2, 1, 0)),
    # output_shape: total = full - out; begins get total - total//2 (ONNX, not same_upper)
    (dict(stride=(2, 2), output_shape=(6, 5)), None),
    (dict(stride=(2, 2), pad_type="same_upper"), None),
    (dict(stride=(2, 2), pad_type="same_lower"), None),
])
def test_conv_transpose_pads_output_shape_and_pad_types(kw, pads):
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(2, 2, 3, 2))
    y, = run_ops(lambda a, b: ops.conv_transpose(a, b, **kw), x, w)
    stride = kw.get("stride", (1, 1))
    full = [stride[d] * (x.shape[2 + d] - 1) + w.shape[2 + d] for d in range(2)]
    if pads is None:
        want_sp = kw.get("output_shape") or [x.shape[2 + d] * stride[d] for d in range(2)]
        total = [f - o for f, o in zip(full, want_sp)]
        small = [t // 2 for t in total]
        big = [t - s for t, s in zip(total, small)]
        pads = small + big if kw.get("pad_type") == "same_upper" else big + small
    want = conv_transpose_ref(x, w, stride, pads, (1, 1), 1, (0, 0))
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_conv_transpose_grads_match_finite_differences():
    rng = np.random.default_rng(2)
    fn = lambda a, b: ops.conv_transpose(a, b, stride=(2, 1), padding=(1, 0, 0, 1),  # noqa: E731
                                         groups=2, output_padding=(1, 0))
    arrs = [rng.normal(size=(1, 2, 3, 2)), rng.normal(size=(2, 1, 2, 2))]
    dy = rng.normal(size=run_ops(fn, *arrs)[0].shape)
    _, got = grads(fn, arrs, [dy])
    for g, w in zip(got, numeric_grads(fn, arrs, [dy])):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, i: ops.conv_transpose(x, w, output_padding=(2, 0)), ValueError,
     "output_padding"),
    (lambda x, w, i: ops.conv_transpose(x, ops.reshape(w, (3, 2, 2, 2)), groups=1), ValueError,
     "dim 0"),
    (lambda x, w, i: ops.conv_transpose(x, w, output_shape=(20, 20)), ValueError,
     "larger than the full"),
])
def test_builder_errors(build, err, match):
    check_image_builder_error(build, err, match)
