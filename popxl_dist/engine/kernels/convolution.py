"""Kernels: Conv, ConvTranspose, ConvDataGrad, ConvWeightsGrad, AveragePool (+Grad) and MaxPool
(+Grad): windowed sweeps over the spatial dims (im2col over kernel offsets).

float16 inputs are computed in float32 and rounded once; float8 operands (a log2_scale third
input) are decoded first (see `float8.pow2scaled`).
"""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, as_dtype, np_dtype
from .registry import kernel

__all__: list = []   # registrations only


def _calc(dt: np.dtype) -> np.dtype:
    return F32 if dt == F16 else dt


# --- convolution and pooling (im2col over kernel offsets) -----------------------------------

class _Windows:
    """Static geometry of a strided, dilated, padded window sweep over the spatial dims."""

    def __init__(self, in_shape, kernel, strides, pads, dilations, out_sp):
        n = len(kernel)
        self.in_shape = tuple(in_shape)
        self.begins = tuple(pads[:n])
        sp = in_shape[2:]
        # ends grow if ceil_mode windows run past the given padding
        self.ends = tuple(max(pads[n + d], (out_sp[d] - 1) * strides[d]
                              + (kernel[d] - 1) * dilations[d] + 1 - sp[d] - pads[d])
                          for d in range(n))
        self.padded = tuple(s + b + e for s, b, e in zip(sp, self.begins, self.ends))
        self.out_sp = tuple(out_sp)
        self.nk = int(np.prod(kernel))
        self.slices = [tuple(slice(k * dl, k * dl + st * (o - 1) + 1, st)
                             for k, dl, st, o in zip(off, dilations, strides, out_sp))
                       for off in np.ndindex(*kernel)]
        self.crop = tuple(slice(b, b + s) for b, s in zip(self.begins, sp))

    def pad(self, x: np.ndarray, value=0) -> np.ndarray:
        if not any(self.begins) and not any(self.ends):
            return x
        width = [(0, 0)] * (x.ndim - len(self.begins)) + list(zip(self.begins, self.ends))
        return np.pad(x, width, constant_values=value)

    def cols(self, xp: np.ndarray, lead: int) -> np.ndarray:
        """(*lead dims, K, *out_sp): the window cells of every output position."""
        pre = (slice(None),) * lead
        return np.stack([xp[pre + sl] for sl in self.slices], axis=lead)

    def fold(self, dcols: np.ndarray, lead: int) -> np.ndarray:
        """Adjoint of `cols` followed by cropping the padding."""
        out = np.zeros(dcols.shape[:lead] + self.padded, dtype=dcols.dtype)
        pre = (slice(None),) * lead
        for i, sl in enumerate(self.slices):
            out[pre + sl] += dcols[pre + (i,)]
        return out[pre + self.crop]


def _conv_geometry(attrs, x_shape, w_shape, out_sp):
    return _Windows(x_shape, w_shape[2:], attrs["strides"], attrs["pads"], attrs["dilations"],
                    out_sp)


def _conv_cols(win, x, g, calc):
    n, c = x.shape[:2]
    xp = win.pad(as_dtype(x, calc)).reshape((n, g, c // g) + win.padded)
    cols = win.cols(xp, 3)                                    # (N, g, C/g, K, *O)
    return cols.reshape(n, g, (c // g) * win.nk, -1)          # (N, g, C/g*K, P)


def _conv_fn(attrs, x_shape, w_shape, out_shape, calc):
    """fn(x, w) -> conv in `calc` (not rounded to the output dtype)."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, out_shape[2:])
    m = w_shape[0]

    def run(x, w):
        cols = _conv_cols(win, x, g, calc)
        wg = w.astype(calc, copy=False).reshape(g, m // g, -1)
        return np.matmul(wg, cols).reshape(out_shape)
    return run


def _conv_data_grad_fn(attrs, dy_shape, w_shape, x_shape, calc):
    """fn(dy, w) -> the conv's input gradient of shape `x_shape` in `calc` (also ConvTranspose:
    the transpose of a conv whose input is the output)."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, dy_shape[2:])
    n, c, m = x_shape[0], x_shape[1], w_shape[0]

    def run(dy, w):
        wg = w.astype(calc, copy=False).reshape(g, m // g, -1)
        dyg = dy.astype(calc, copy=False).reshape(n, g, m // g, -1)
        dcols = np.matmul(wg.transpose(0, 2, 1), dyg)          # (N, g, C/g*K, P)
        dcols = dcols.reshape((n, g, c // g, win.nk) + win.out_sp)
        return win.fold(dcols, 3).reshape(x_shape)
    return run


def _conv_weights_grad_fn(attrs, dy_shape, x_shape, w_shape, calc):
    """fn(dy, x) -> the conv's weight gradient in `calc`."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, dy_shape[2:])
    n, m = x_shape[0], w_shape[0]

    def run(dy, x):
        cols = _conv_cols(win, x, g, calc)
        dyg = dy.astype(calc, copy=False).reshape(n, g, m // g, -1)
        dw = np.matmul(dyg, cols.transpose(0, 1, 3, 2)).sum(axis=0)
        return dw.reshape(w_shape)
    return run


def _conv_family(op_type: str, make_fn, doc: str):
    """Register the kernel of a conv-family op: `make_fn(attrs, in0 shape, in1 shape, out
    shape, calc)` in float32 for float16 (rounded once); float8 operands with a log2_scale
    third input are decoded, run in float32 and scaled by 2^log2_scale before rounding."""

    def factory(attrs, ins, outs, env=None):
        dt = np_dtype(outs[0])
        fn = make_fn(attrs, ins[0].shape, ins[1].shape, outs[0].shape, _calc(dt))
        if len(ins) == 3:
            from .float8 import pow2scaled

            return pow2scaled(fn, ins, outs, op_type, env)
        return lambda a, b: as_dtype(fn(a, b), dt)

    factory.__doc__ = doc
    kernel(op_type, settings=True)(factory)


_conv_family("Conv", _conv_fn, "ins (x, w[, log2_scale]) -> y.")
_conv_family("ConvTranspose", _conv_data_grad_fn,
             "ins (x (N, C, *in), w (C, M/group, *k)[, log2_scale]) -> y (N, M, *out): the "
             "input gradient of the conv (N, M, *out) -> (N, C, *in) with weight w.")
_conv_family("ConvDataGrad", _conv_data_grad_fn, "ins (dy, w) -> dx.")
_conv_family("ConvWeightsGrad", _conv_weights_grad_fn, "ins (dy, x) -> dw.")


class _Pooling:
    """A pool op's geometry: the input dilated by `in_dilations` (inserted zero cells), the
    window sweep over it, and the output padded by `out_pads` (zeros)."""

    def __init__(self, attrs, x_shape, y_shape):
        n = len(x_shape) - 2
        self.in_dil = tuple(attrs.get("in_dilations") or (1,) * n)
        op = tuple(attrs.get("out_pads") or (0,) * (2 * n))
        self.dilated = tuple(x_shape[:2]) + tuple(
            d * (s - 1) + 1 for d, s in zip(self.in_dil, x_shape[2:]))
        self.keep = tuple(slice(None, None, d) for d in self.in_dil)
        inner = tuple(o - op[i] - op[n + i] for i, o in enumerate(y_shape[2:]))
        self.out_width = [(0, 0), (0, 0)] + [(op[i], op[n + i]) for i in range(n)]
        self.out_crop = tuple(slice(op[i], op[i] + inner[i]) for i in range(n))
        self.padded_out = any(op)
        self.win = _Windows(self.dilated, attrs["kernel_shape"], attrs["strides"],
                            attrs["pads"], attrs["dilations"], inner)

    def dilate(self, x: np.ndarray) -> np.ndarray:
        if x.shape == self.dilated:
            return x
        out = np.zeros(self.dilated, dtype=x.dtype)
        out[(slice(None), slice(None)) + self.keep] = x
        return out

    def undilate(self, dx: np.ndarray) -> np.ndarray:
        return dx[(slice(None), slice(None)) + self.keep]

    def pad_out(self, y: np.ndarray) -> np.ndarray:
        return np.pad(y, self.out_width) if self.padded_out else y

    def crop_out(self, dy: np.ndarray) -> np.ndarray:
        return dy[(slice(None), slice(None)) + self.out_crop] if self.padded_out else dy


def _avg_counts(win, calc):
    ones = win.pad(np.ones((1, 1) + win.in_shape[2:], dtype=calc))
    return win.cols(ones, 2).sum(axis=2)                       # (1, 1, *O) real cells


@kernel("AveragePool")
def _avg_pool_kernel(attrs, ins, outs):
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, ins[0].shape, outs[0].shape)
    win = pool.win
    counts = _avg_counts(win, calc)

    def run(x):
        s = win.cols(win.pad(pool.dilate(x.astype(calc, copy=False))), 2).sum(axis=2)
        return pool.pad_out(s / counts).astype(dt, copy=False)
    return run


@kernel("AveragePoolGrad")
def _avg_pool_grad_kernel(attrs, ins, outs):
    """ins (dy, x) -> dx."""
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, outs[0].shape, ins[0].shape)
    win = pool.win
    counts = _avg_counts(win, calc)

    def run(dy, x):
        share = pool.crop_out(dy).astype(calc) / counts
        dcols = np.broadcast_to(share[:, :, None], share.shape[:2] + (win.nk,) + win.out_sp)
        return pool.undilate(win.fold(dcols, 2)).astype(dt, copy=False)
    return run


@kernel("MaxPool")
def _max_pool_kernel(attrs, ins, outs):
    dt = np_dtype(outs[0])
    pool = _Pooling(attrs, ins[0].shape, outs[0].shape)
    win = pool.win

    def run(x):
        y = win.cols(win.pad(pool.dilate(x), -np.inf), 2).max(axis=2)
        return pool.pad_out(y).astype(dt, copy=False)
    return run


@kernel("MaxPoolGrad")
def _max_pool_grad_kernel(attrs, ins, outs):
    """ins (dy, x) -> dx: each output's gradient goes to its (first) maximal input cell."""
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, outs[0].shape, ins[0].shape)
    win = pool.win

    def run(dy, x):
        cols = win.cols(win.pad(pool.dilate(x), -np.inf), 2)
        arg = cols.argmax(axis=2)
        onehot = np.arange(win.nk).reshape((1, 1, win.nk) + (1,) * len(win.out_sp)) \
            == arg[:, :, None]
        dcols = onehot * pool.crop_out(dy).astype(calc)[:, :, None]
        return pool.undilate(win.fold(dcols, 2)).astype(dt, copy=False)
    return run
