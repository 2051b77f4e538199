"""Kernels: RoiAlign and RoiAlignGrad.

The bilinear sampling is separable, so each roi's bin averages are `Ay @ X[b] @ Ax.T / count`
with (out, size) matrices Ay, Ax that sum the bilinear weights of the bin's samples along each
axis (ONNX RoiAlign-10 / Detectron semantics); the rois of one image share one GEMM with it.
The gradient applies the transposes and adds into the roi's image.
"""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, np_dtype
from .registry import kernel

__all__: list = []


def _axis_weights(start, length, out: int, grid, size: int) -> np.ndarray:
    """(R, out, size) summed bilinear weights of each bin's samples along one axis."""
    n_rois = start.shape[0]
    g_max = int(grid.max()) if n_rois else 1
    ph = np.arange(out).reshape(1, out, 1)
    ig = np.arange(g_max).reshape(1, 1, g_max)
    bin_len = (length / out).reshape(-1, 1, 1)
    g = grid.reshape(-1, 1, 1)
    pos = start.reshape(-1, 1, 1) + ph * bin_len + (ig + 0.5) * bin_len / g     # (R, out, G)
    valid = (pos >= -1.0) & (pos <= size) & (ig < g)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.intp)
    top = low >= size - 1
    low = np.where(top, size - 1, low)
    high = np.where(top, size - 1, low + 1)
    frac = np.where(top, 0.0, pos - low)
    w = np.zeros((n_rois, out, size))
    r_idx = np.broadcast_to(np.arange(n_rois).reshape(-1, 1, 1), pos.shape)
    p_idx = np.broadcast_to(ph, pos.shape)
    np.add.at(w, (r_idx, p_idx, low), np.where(valid, 1.0 - frac, 0.0))
    np.add.at(w, (r_idx, p_idx, high), np.where(valid, frac, 0.0))
    return w


def _roi_matrices(attrs, rois: np.ndarray, height: int, width: int):
    """(Ay (R, out_h, H), Ax (R, out_w, W), count (R,)) for float64 rois."""
    out_h, out_w = attrs["output_size"]
    ratio = int(attrs["sampling_ratio"])
    b = rois.astype(np.float64) * attrs["spatial_scale"]
    x0, y0 = b[:, 0], b[:, 1]
    roi_w = np.maximum(b[:, 2] - x0, 1.0)
    roi_h = np.maximum(b[:, 3] - y0, 1.0)
    if ratio > 0:
        gh = gw = np.full(b.shape[0], ratio)
    else:
        gh, gw = np.ceil(roi_h / out_h).astype(int), np.ceil(roi_w / out_w).astype(int)
    ay = _axis_weights(y0, roi_h, out_h, gh, height)
    ax = _axis_weights(x0, roi_w, out_w, gw, width)
    return ay, ax, np.maximum(gh * gw, 1).astype(np.float64)


def _images(idx: np.ndarray, n: int) -> np.ndarray:
    idx = idx.astype(np.intp, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"RoiAlign: batch_index values must lie in [0, {n}), got "
                         f"{idx.min()}..{idx.max()}")
    return idx


@kernel("RoiAlign")
def _roi_align(attrs, ins, outs):
    dt = np_dtype(outs[0])
    calc = F32 if dt == F16 else dt
    n, c, height, width = ins[0].shape
    r, _, p, q = outs[0].shape

    def run(x, rois, batch_index):
        idx = _images(batch_index, n)
        ay, ax, count = _roi_matrices(attrs, rois, height, width)
        ay, ax = ay.astype(calc), ax.astype(calc)
        y = np.empty((r, c, p, q), calc)
        for b in np.unique(idx):             # one GEMM per image over all its rois' rows
            sel = np.flatnonzero(idx == b)
            z = np.matmul(ay[sel].reshape(-1, height), x[b].astype(calc, copy=False))
            z = z.reshape(c, sel.size, p, width).transpose(1, 0, 2, 3)      # (S, C, P, W)
            y[sel] = np.matmul(z, ax[sel].transpose(0, 2, 1)[:, None])
        y /= count.astype(calc).reshape(-1, 1, 1, 1)
        return y.astype(dt, copy=False)
    return run


@kernel("RoiAlignGrad")
def _roi_align_grad(attrs, ins, outs):
    """ins (dy, rois, batch_index) -> dx (the shape of the forward input)."""
    dt = np_dtype(outs[0])
    calc = F32 if dt == F16 else dt
    x_shape = outs[0].shape
    n, c, height, width = x_shape

    def run(dy, rois, batch_index):
        idx = _images(batch_index, n)
        ay, ax, count = _roi_matrices(attrs, rois, height, width)
        g = dy.astype(calc) / count.astype(calc).reshape(-1, 1, 1, 1)
        t = np.matmul(g, ax.astype(calc)[:, None])                           # (R, C, P, W)
        dx = np.zeros(x_shape, calc)
        for b in np.unique(idx):
            sel = np.flatnonzero(idx == b)
            tb = t[sel].transpose(1, 0, 2, 3).reshape(c, -1, width)         # (C, S*P, W)
            dx[b] = np.matmul(ay[sel].reshape(-1, height).T.astype(calc), tb)
        return dx.astype(dt, copy=False)
    return run
