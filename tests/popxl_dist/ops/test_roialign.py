"""roi_align against a NumPy reference written here (a scalar loop following the ONNX
definition), its gradient against finite differences (float64), and builder errors."""
import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import check_image_builder_error, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


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


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, i: ops.roi_align(x, w, i, (2, 2), 1.0, 0), ValueError, "num_rois, 4"),
])
def test_builder_errors(build, err, match):
    check_image_builder_error(build, err, match)
