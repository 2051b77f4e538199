"""Kernels: RotaryPosEmbed (+Grad), GroupQuantizeDecompress, LinearLayout and
DenseConstSparseMatMul (upstream: popxl.addons C++ custom ops). float16 computes in float32 and
rounds once."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._util import F16, F32, np_dtype
from .registry import kernel

__all__: list = []   # registrations only


def _rotary(attrs, outs, sign: float) -> Callable:
    r = int(attrs["rotary_dim"])
    dt = np_dtype(outs[0])

    def run(t, sin, cos):
        out = t.astype(F32)                         # a fresh array
        re = out[..., 0:r:2].copy()
        im = out[..., 1:r:2].copy()
        s = sin.astype(F32)[:, :, None, :]           # (1 or batch, seq, 1, rotary_dim // 2)
        c = cos.astype(F32)[:, :, None, :]
        if sign > 0:
            out[..., 0:r:2] = re * c - im * s
            out[..., 1:r:2] = im * c + re * s
        else:
            out[..., 0:r:2] = re * c + im * s
            out[..., 1:r:2] = im * c - re * s
        return out.astype(dt, copy=False)
    return run


@kernel("RotaryPosEmbed")
def _rotary_kernel(attrs, ins, outs) -> Callable:
    """RoPE on `(batch, seq, heads, head_dim)`: feature pairs (2i, 2i + 1) of the first
    `rotary_dim` are the (real, imaginary) parts of a complex number turned by the angle of the
    position, (re, im) -> (re cos - im sin, im cos + re sin); the other features pass through.
    `sin` / `cos` `(1 or batch, seq, rotary_dim // 2)` broadcast over the heads."""
    return _rotary(attrs, outs, 1.0)


@kernel("RotaryPosEmbedGrad")
def _rotary_grad_kernel(attrs, ins, outs) -> Callable:
    """The inverse rotation (the transpose of an orthogonal map): (re cos + im sin, im cos - re
    sin)."""
    return _rotary(attrs, outs, -1.0)


_SHIFTS = np.array([12, 8, 4, 0], np.uint16)     # first code in the highest nibble


def unpack_nibbles(t: np.ndarray) -> np.ndarray:
    """uint16 `(..., W)` -> uint8 codes `(..., 4W)`: word w holds codes 4w..4w+3, highest
    nibble first (upstream's packing)."""
    return ((t[..., None] >> _SHIFTS) & 0xF).astype(np.uint8).reshape(t.shape[:-1] + (-1,))


@kernel("GroupQuantizeDecompress")
def _gq_decompress_kernel(attrs, ins, outs) -> Callable:
    dim = int(attrs["dim"])
    dt = np_dtype(outs[0])
    lead = tuple(ins[0].shape[:-2])

    def run(t, scale, bias):
        v = unpack_nibbles(t).astype(F32)
        v *= scale.astype(F32)
        v += bias.astype(F32)
        v = np.moveaxis(v.reshape(lead + (-1,)), -1, dim)
        return np.ascontiguousarray(v.astype(dt, copy=False))
    return run


@kernel("LinearLayout", view=True)
def _linear_layout_kernel(attrs, ins, outs) -> Callable:
    return lambda t: t


@kernel("DenseConstSparseMatMul")
def _dense_sparse_matmul_kernel(attrs, ins, outs) -> Callable:
    """The constant CSR matrix is expanded once, at compile time, and multiplied by BLAS
    (float32 accumulation for float16)."""
    data, indices, indptr = (ins[i].data for i in (1, 2, 3))
    if data is None or indices is None or indptr is None:
        raise ValueError("the sparse matrix must be constant (values, column indices and row "
                         "pointers)")
    rows, cols = int(attrs["rows"]), int(attrs["cols"])
    dense = np.zeros((rows, cols), F32)
    row_of = np.repeat(np.arange(rows), np.diff(indptr))
    np.add.at(dense, (row_of, indices), data.astype(F32))
    dt = np_dtype(outs[0])
    if dt == F16:
        return lambda lhs, *_: np.matmul(lhs.astype(F32), dense).astype(F16)
    return lambda lhs, *_: np.matmul(lhs, dense)
