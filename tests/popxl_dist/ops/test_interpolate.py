"""interpolate (ONNX Resize) against a NumPy reference written here (a scalar loop following the
ONNX definition, and PyTorch's `interpolate` conventions as interpolation matrices), gradients
against finite differences (float64), and builder errors."""
import math

import numpy as np
import pytest

import popxl.ops as ops

from harness import check_image_builder_error, grads, numeric_grads, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


# --- interpolate --------------------------------------------------------------------------
def resize_ref(x, scales, mode, nearest_mode, ctm, coord_dtype=float):
    """ONNX Resize element by element (edge-clamped neighbours, cubic A = -0.75); source
    coordinates and their fractions computed in `coord_dtype` (np.float32: as the IPU and
    PyTorch do for float16/32 data), the weights in float64."""
    out_shape = tuple(int(math.floor(d * s)) for d, s in zip(x.shape, scales))
    f = coord_dtype

    def coord(o, size, out, s):
        if f is not float:
            o, size, out, s = f(o), f(size), f(out), f(s)
            if ctm in ("half_pixel", "pytorch_half_pixel"):
                return (o + f(0.5)) / s - f(0.5) if ctm == "half_pixel" or out > 1 else f(0)
            if ctm == "align_corners":
                return o * (size - f(1)) / (out - f(1)) if out > 1 else f(0)
            return o / s if ctm == "asymmetric" else (o + f(0.5)) / s
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
        r = float(xo - (f(i0) if f is not float else i0))    # weights: in float64
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


@pytest.mark.parametrize("mode,nearest_mode,ctm,scales", RESIZES)
def test_float32_interpolation_is_the_exact_result_rounded_once(mode, nearest_mode, ctm,
                                                                scales):
    """float32 data: float32 source coordinates (as the IPU and PyTorch), weights and sums in
    float64, rounded once (upstream tests it against PyTorch's float32 interpolate and ONNX's
    reference to 1e-7)."""
    x = np.random.default_rng(4).random((1, 3, 5, 5)).astype(np.float32)
    y, = run_ops(lambda t: ops.interpolate(t, scales, mode, nearest_mode, ctm), x)
    exact = resize_ref(x.astype(np.float64), scales, mode, nearest_mode, ctm, np.float32)
    assert y.dtype == np.float32 and y.shape == exact.shape
    half_ulp = np.spacing(np.abs(y)).astype(np.float64) / 2
    assert (np.abs(y - exact) <= half_ulp * (1 + 1e-6)).all()   # float64 sum order aside


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


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2)), ValueError, "one entry per dim"),
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2, 2), mode="area"), ValueError, "mode"),
    (lambda x, w, i: ops.interpolate(x, (1, 1, 2, 2),
                                     coordinate_transformation_mode="tf_crop_and_resize"),
     ValueError, "coordinate_transformation_mode"),
])
def test_builder_errors(build, err, match):
    check_image_builder_error(build, err, match)
