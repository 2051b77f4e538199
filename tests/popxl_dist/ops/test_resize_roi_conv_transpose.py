"""conv_transpose, interpolate, roi_align and grouped_scatter_reduce against NumPy references
written here (scalar loops following the ONNX definitions, and PyTorch's `interpolate`
conventions as interpolation matrices), gradients against finite differences (float64), and
builder errors."""
import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import grads, numeric_grads, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


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


# --- interpolate --------------------------------------------------------------------------
def resize_ref(x, scales, mode, nearest_mode, ctm):
    """ONNX Resize element by element (edge-clamped neighbours, cubic A = -0.75)."""
    out_shape = tuple(int(math.floor(d * s)) for d, s in zip(x.shape, scales))

    def coord(o, size, out, s):
        if ctm == "half_pixel":
            return (o + 0.5) / s - 0.5
        if ctm == "pytorch_half_pixel":
            return (o + 0.5) / s - 0.5 if out > 1 else 0.0
        if ctm == "align_corners":
            return o * (size - 1) / (out - 1) if out > 1 else 0.0
        if ctm == "asymmetric":
            return o / s
        return (o + 0.5) / s

    def taps(xo, size):
        i0 = math.floor(xo)
        r = xo - i0
        if mode == "nearest":
            pick = {"round_prefer_floor": i0 + (r > 0.5), "round_prefer_ceil": i0 + (r >= 0.5),
                    "floor": i0, "ceil": math.ceil(xo)}[nearest_mode]
            return [(pick, 1.0)]
        if mode == "linear":
            return [(i0, 1 - r), (i0 + 1, r)]
        a = -0.75

        def cub(t):
            t = abs(t)
            if t <= 1:
                return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
            return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a if t < 2 else 0.0
        return [(i0 + k, cub(r - k)) for k in (-1, 0, 1, 2)]

    y = np.zeros(out_shape)
    for o in np.ndindex(*out_shape):
        per_dim = [taps(coord(o[d], x.shape[d], out_shape[d], scales[d]), x.shape[d])
                   if scales[d] != 1 else [(o[d], 1.0)] for d in range(x.ndim)]
        acc = 0.0
        for combo in np.ndindex(*[len(p) for p in per_dim]):
            idx, wgt = [], 1.0
            for d, k in enumerate(combo):
                i, wd = per_dim[d][k]
                idx.append(min(max(i, 0), x.shape[d] - 1))
                wgt *= wd
            acc += wgt * x[tuple(idx)]
        y[o] = acc
    return y


RESIZES = [
    ("nearest", "round_prefer_floor", "half_pixel", (1, 1, 2.0, 1.5)),
    ("nearest", "round_prefer_ceil", "asymmetric", (1, 1, 0.5, 2.5)),
    ("nearest", "floor", "align_corners", (1, 1, 1.7, 3.0)),
    ("nearest", "ceil", "tf_half_pixel_for_nn", (1, 1, 2.0, 0.75)),
    ("linear", "round_prefer_floor", "pytorch_half_pixel", (1, 1, 3.0, 0.25)),
    ("linear", "round_prefer_floor", "asymmetric", (1, 2.0, 1.5, 1)),
    ("cubic", "round_prefer_floor", "align_corners", (1, 1, 2.0, 1.3)),
    ("cubic", "round_prefer_floor", "half_pixel", (1, 1, 0.6, 2.0)),
]


@pytest.mark.parametrize("mode,nearest_mode,ctm,scales", RESIZES)
def test_interpolate_matches_onnx_reference(mode, nearest_mode, ctm, scales):
    x = np.random.default_rng(3).normal(size=(1, 2, 4, 5))
    y, = run_ops(lambda t: ops.interpolate(t, scales, mode, nearest_mode, ctm), x)
    want = resize_ref(x, scales, mode, nearest_mode, ctm)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def torch_interpolation_matrix(n_in, scale_factor, mode, align_corners):
    """(n_out, n_in) weights of PyTorch's `interpolate(scale_factor=...)` along one axis, from
    its definition: the source coordinate is `dst * (n_in - 1) / (n_out - 1)` with
    align_corners, else `(dst + 0.5) / scale_factor - 0.5`, clamped at 0 for (bi)linear;
    linear blends the two neighbours, cubic the four with A = -0.75 (neighbours clamped to
    the edge), nearest takes `floor(dst / scale_factor)`."""
    n_out = int(math.floor(n_in * scale_factor))
    m = np.zeros((n_out, n_in))
    for dst in range(n_out):
        if mode == "nearest":
            m[dst, min(int(math.floor(dst / scale_factor)), n_in - 1)] = 1.0
            continue
        if align_corners:
            src = dst * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            src = (dst + 0.5) / scale_factor - 0.5
            if mode == "linear":
                src = max(src, 0.0)
        i0 = math.floor(src)
        t = src - i0
        if mode == "linear":
            taps = [(i0, 1 - t), (i0 + 1, t)]
        else:
            a = -0.75

            def near(d):          # |d| <= 1
                return ((a + 2) * d - (a + 3)) * d * d + 1

            def far(d):           # 1 < |d| < 2
                return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
            taps = [(i0 - 1, far(t + 1)), (i0, near(t)), (i0 + 1, near(1 - t)),
                    (i0 + 2, far(2 - t))]
        for i, wgt in taps:
            m[dst, min(max(i, 0), n_in - 1)] += wgt
    return m


@pytest.mark.parametrize("mode,ctm", [
    ("linear", "half_pixel"), ("linear", "align_corners"), ("cubic", "half_pixel"),
    ("nearest", "asymmetric"),
])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_interpolate_matches_torch_conventions(mode, ctm, dtype):
    """Each mode and coordinate transform against PyTorch's `interpolate` of the same input
    (bilinear / bicubic / nearest, align_corners as the transform says), in NumPy."""
    x = np.random.default_rng(4).normal(size=(2, 3, 5, 6)).astype(dtype)
    nearest_mode = "floor" if mode == "nearest" else "round_prefer_floor"
    y, = run_ops(lambda t: ops.interpolate(t, (1, 1, 2.0, 0.5), mode, nearest_mode, ctm), x)
    rows = torch_interpolation_matrix(5, 2.0, mode, ctm == "align_corners")
    cols = torch_interpolation_matrix(6, 0.5, mode, ctm == "align_corners")
    want = np.einsum("nchw,Hh,Ww->ncHW", x.astype(F32).astype(F64), rows, cols)
    assert y.dtype == dtype
    tol = 2e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_interpolate_grads_match_finite_differences(mode):
    rng = np.random.default_rng(5)
    fn = lambda t: ops.interpolate(t, (1, 1, 1.5, 0.7), mode)  # noqa: E731
    x = rng.normal(size=(1, 2, 3, 4))
    dy = rng.normal(size=run_ops(fn, x)[0].shape)
    _, (got,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(got, numeric_grads(fn, [x], [dy])[0], rtol=1e-6, atol=1e-8)


# --- roi_align ------------------------------------------------------------------------------
def roi_align_ref(x, rois, batch_index, out_size, spatial_scale, sampling_ratio):
    """ONNX RoiAlign-10 (Detectron) one sample at a time."""
    n_rois, (_, c, h, w) = rois.shape[0], x.shape
    oh, ow = out_size
    y = np.zeros((n_rois, c, oh, ow))
    for r in range(n_rois):
        x1, y1, x2, y2 = (float(v) * spatial_scale for v in rois[r])
        rw, rh = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = sampling_ratio or math.ceil(rh / oh)
        gw = sampling_ratio or math.ceil(rw / ow)
        img = x[batch_index[r]]
        for ph, pw in np.ndindex(oh, ow):
            acc = np.zeros(c)
            for iy, ix in np.ndindex(gh, gw):
                yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                if yy < -1 or yy > h or xx < -1 or xx > w:
                    continue
                yy, xx = max(yy, 0.0), max(xx, 0.0)
                yl, xl = int(yy), int(xx)
                if yl >= h - 1:
                    yl = yh = h - 1
                    yy = float(yl)
                else:
                    yh = yl + 1
                if xl >= w - 1:
                    xl = xh = w - 1
                    xx = float(xl)
                else:
                    xh = xl + 1
                ly, lx = yy - yl, xx - xl
                acc += ((1 - ly) * (1 - lx) * img[:, yl, xl] + (1 - ly) * lx * img[:, yl, xh]
                        + ly * (1 - lx) * img[:, yh, xl] + ly * lx * img[:, yh, xh])
            y[r, :, ph, pw] = acc / max(gh * gw, 1)
    return y


ROIS = np.array([[0.5, 1.0, 5.0, 4.5], [-2.0, -1.0, 3.0, 9.0], [3.0, 2.0, 3.2, 2.1],
                 [6.0, 5.0, 14.0, 12.0]])
BATCH = np.array([1, 0, 1, 0], np.int32)


@pytest.mark.parametrize("sampling_ratio,spatial_scale,out_size", [(0, 1.0, (3, 2)),
                                                                   (2, 0.5, (2, 4))])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_roi_align_matches_reference(sampling_ratio, spatial_scale, out_size, dtype):
    x = np.random.default_rng(6).normal(size=(2, 3, 6, 7)).astype(dtype)
    y, = run_ops(lambda t, r, b: ops.roi_align(t, r, b, out_size, spatial_scale, sampling_ratio),
                 x, ROIS.astype(dtype), BATCH)
    want = roi_align_ref(x.astype(F64), ROIS.astype(dtype).astype(F64), BATCH, out_size,
                         spatial_scale, sampling_ratio)
    assert y.shape == want.shape and y.dtype == dtype and np.abs(want).max() > 0
    tol = 3e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_roi_align_grad_matches_finite_differences():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 2, 4, 5))
    dy = rng.normal(size=(4, 2, 2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t, r, b: ops.roi_align(t, r, b, (2, 3), 0.8, 0),
                            popxl.TensorSpec(x.shape, popxl.float64),
                            popxl.TensorSpec(ROIS.shape, popxl.float64),
                            popxl.TensorSpec(BATCH.shape, popxl.int32))
        bwd = popxl.transforms.autodiff(g, grads_required=[g.inputs[0]])
        info = ops.call_with_info(g, popxl.constant(x, popxl.float64),
                                  popxl.constant(ROIS, popxl.float64), popxl.constant(BATCH))
        dx, = ops.call(bwd.graph, popxl.constant(dy, popxl.float64),
                       inputs_dict=bwd.inputs_dict(info))
        s = popxl.d2h_stream(dx.shape, dx.dtype)
        ops.host_store(s, dx)
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()[s]
    eps = 1e-6
    want = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        want[i] = np.sum((roi_align_ref(xp, ROIS, BATCH, (2, 3), 0.8, 0)
                          - roi_align_ref(xm, ROIS, BATCH, (2, 3), 0.8, 0)) * dy) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_roi_align_batch_index_out_of_range_raises():
    x = np.zeros((2, 1, 3, 3), F32)
    with pytest.raises(Exception, match=r"batch_index values must lie in \[0, 2\)"):
        run_ops(lambda t, r, b: ops.roi_align(t, r, b, (1, 1), 1.0, 1), x, ROIS.astype(F32),
                np.array([0, 1, 2, 0], np.int32))


# --- grouped_scatter_reduce -----------------------------------------------------------------
def grouped_ref(data, idx, red, size, init=None):
    g, _, rest = data.shape[0], data.shape[1], data.shape[2:]
    out = np.zeros((g, size) + rest) if init is None else init.copy()
    for gi in range(g):
        for k in range(size):
            sel = data[gi][idx[gi] == k]
            if not len(sel):
                continue
            if red == "none":
                out[gi, k] = sel[-1]
            elif init is None:
                out[gi, k] = {"sum": sel.sum(0), "max": sel.max(0), "min": sel.min(0)}[red]
            else:
                f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[red]
                out[gi, k] = f.reduce(np.concatenate([out[gi, k][None], sel]), axis=0)
    return out


@pytest.mark.parametrize("red", ["sum", "max", "min", "none"])
@pytest.mark.parametrize("with_init", [False, True])
def test_grouped_scatter_reduce_matches_per_group_loop(red, with_init):
    rng = np.random.default_rng(8)
    data = rng.normal(size=(3, 6, 2))
    idx = rng.integers(0, 4, size=(3, 6)).astype(np.int32)      # one index list per group
    init = rng.normal(size=(3, 4, 2)) if with_init else None
    arrays = [data, idx] + ([init] if with_init else [])
    y, = run_ops(lambda d, i, *v: ops.grouped_scatter_reduce(
        d, i, red, v[0] if v else None, axis=1, axis_size=4, group_size=3), *arrays)
    np.testing.assert_allclose(y, grouped_ref(data, idx, red, 4, init), rtol=1e-12)


def test_grouped_scatter_reduce_full_indices_and_grads():
    rng = np.random.default_rng(9)
    data = rng.normal(size=(2, 5, 3))
    idx = rng.integers(0, 3, size=(2, 5, 3)).astype(np.int32)
    fn = lambda d, i: ops.grouped_scatter_reduce(d, i, "sum", axis=1,  # noqa: E731
                                                 axis_size=3, group_size=2)
    y, = run_ops(fn, data, idx)
    want = np.zeros((2, 3, 3))
    for g, j, c in np.ndindex(*data.shape):
        want[g, idx[g, j, c], c] += data[g, j, c]
    np.testing.assert_allclose(y, want, rtol=1e-12)
    dy = rng.normal(size=(2, 3, 3))
    _, (got,) = grads(fn, [data, idx], [dy])
    np.testing.assert_allclose(got, numeric_grads(fn, [data, idx], [dy])[0], rtol=1e-6)


# --- builder errors -------------------------------------------------------------------------
@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, i: ops.conv_transpose(x, w, output_padding=(2, 0)), ValueError,
     "output_padding"),
    (lambda x, w, i: ops.conv_transpose(x, ops.reshape(w, (3, 2, 2, 2)), groups=1), ValueError,
     "dim 0"),
    (lambda x, w, i: ops.conv_transpose(x, w, output_shape=(20, 20)), ValueError,
     "larger than the full"),
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2)), ValueError, "one entry per dim"),
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2, 2), mode="area"), ValueError, "mode"),
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2, 2),
                                     coordinate_transformation_mode="tf_crop_and_resize"),
     ValueError, "coordinate_transformation_mode"),
    (lambda x, w, i: ops.roi_align(x, w, i, (2, 2), 1.0, 0), ValueError, "num_rois, 4"),
    (lambda x, w, i: ops.grouped_scatter_reduce(x, i, "sum", axis=0, axis_size=2,
                                                group_size=2), ValueError, "group dim 0"),
    (lambda x, w, i: ops.grouped_scatter_reduce(x, i, "sum", axis=1, axis_size=2,
                                                group_size=3), ValueError, "leading group"),
])
def test_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 2, 3, 3)), popxl.float32, "x")
        w = popxl.variable(np.zeros((2, 3, 2, 2)), popxl.float32, "w")
        i = popxl.variable(np.zeros((2, 2, 3, 3), np.int32), popxl.int32, "i")
        with pytest.raises(err, match=match):
            build(x, w, i)
