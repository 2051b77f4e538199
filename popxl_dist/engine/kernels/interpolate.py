"""Kernels: Resize and ResizeGrad (ONNX Resize, separable: one (out, in) interpolation matrix
per resized dim; the gradient applies the transposes)."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from ._util import F16, F32, np_dtype
from .registry import kernel

__all__: list = []

_CUBIC_A = -0.75


def _coords(out: int, size: int, scale: float, ctm: str, dt: np.dtype) -> np.ndarray:
    """Source coordinates of the `out` outputs, computed in `dt` (float32 for float16/32 data,
    as the IPU and PyTorch compute them)."""
    x = np.arange(out, dtype=dt)
    half, scale = dt.type(0.5), dt.type(scale)
    if ctm == "half_pixel":
        return (x + half) / scale - half
    if ctm == "pytorch_half_pixel":
        return (x + half) / scale - half if out > 1 else np.zeros(out, dt)
    if ctm == "align_corners":
        return x * dt.type(size - 1) / dt.type(out - 1) if out > 1 else np.zeros(out, dt)
    if ctm == "asymmetric":
        return x / scale
    return (x + half) / scale                                  # tf_half_pixel_for_nn


def _cubic(r: np.ndarray) -> np.ndarray:
    """(n, 4) weights of neighbours i0-1 .. i0+2 at fraction r."""
    a = _CUBIC_A
    s = 1 - r
    return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * s - (a + 3)) * s * s + 1,
                     ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a], axis=1)


def resize_matrix(size: int, out: int, scale: float, mode: str, nearest_mode: str,
                  ctm: str, coord_dt: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The (out, size) float64 matrix of a 1-D resize (edge-clamped neighbours): source
    coordinates and their fractions in `coord_dt`, the weights from them in float64."""
    x = _coords(out, size, scale, ctm, np.dtype(coord_dt))
    i0 = np.floor(x)
    r = (x - i0).astype(np.float64)          # the weights from it: in float64
    rows = np.arange(out)
    m = np.zeros((out, size))
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            idx = i0 + (r > 0.5)
        elif nearest_mode == "round_prefer_ceil":
            idx = i0 + (r >= 0.5)
        elif nearest_mode == "floor":
            idx = i0
        else:
            idx = np.ceil(x)
        m[rows, np.clip(idx, 0, size - 1).astype(np.intp)] = 1.0
        return m
    if mode == "linear":
        offsets, weights = (0, 1), np.stack([1 - r, r], axis=1)
    else:
        offsets, weights = (-1, 0, 1, 2), _cubic(r)
    for k, off in enumerate(offsets):
        cols = np.clip(i0 + off, 0, size - 1).astype(np.intp)
        np.add.at(m, (rows, cols), weights[:, k])
    return m


def _matrices(attrs, in_shape, out_shape, coord_dt: np.dtype) -> List[Tuple[int, np.ndarray]]:
    """(axis, matrix) for every dim that changes (a scale of 1 is the identity)."""
    res = []
    for axis, (size, out, scale) in enumerate(zip(in_shape, out_shape, attrs["scales"])):
        if scale == 1.0 and size == out:
            continue
        res.append((axis, resize_matrix(size, out, scale, attrs["mode"], attrs["nearest_mode"],
                                        attrs["coordinate_transformation_mode"], coord_dt)))
    return res


def _apply(mats, x: np.ndarray, calc: np.dtype, transpose: bool) -> np.ndarray:
    y = x.astype(calc, copy=False)
    for axis, m in mats:
        m = (m.T if transpose else m).astype(calc)
        y = np.moveaxis(np.tensordot(m, y, axes=([1], [axis])), 0, axis)
    return y


def _calc(dt: np.dtype) -> np.dtype:
    """float16 in float32 (the IPU's partials); float32 in float64 with float32 source
    coordinates (as the IPU and PyTorch), rounded once at the end: what upstream's tests
    against PyTorch's float32 interpolate and ONNX's reference (tolerance 1e-7) accept."""
    return F32 if dt == F16 else np.dtype(np.float64) if dt == F32 else dt


def _resize_fn(attrs, in_shape, out_shape, out_dt, transpose: bool):
    coord_dt = np.dtype(np.float32) if out_dt in (F16, F32) else np.dtype(np.float64)
    mats = _matrices(attrs, in_shape, out_shape, coord_dt)
    calc = _calc(out_dt)

    def run(x):
        return np.ascontiguousarray(_apply(mats, x, calc, transpose), dtype=out_dt)
    return run


@kernel("Resize")
def _resize(attrs, ins, outs):
    return _resize_fn(attrs, ins[0].shape, outs[0].shape, np_dtype(outs[0]), False)


@kernel("ResizeGrad")
def _resize_grad(attrs, ins, outs):
    """ins (dy) -> dx: the transposed interpolation."""
    return _resize_fn(attrs, outs[0].shape, ins[0].shape, np_dtype(outs[0]), True)
