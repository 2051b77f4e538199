"""Kernels: Gelu (tanh approximation) and its grad, Softmax and its grad.

`gelu_tanh`, `gelu_tanh_grad`, `softmax` and `softmax_grad` define the arithmetic; the kernels run
the same operations block by block (see `_blocks`), with the same bits, writing into
preallocated outputs.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ._blocks import (as_f32, contiguous_rows, each_range, elem_blocks, f32_work, out_array,
                      row_blocks, store)
from ._util import (F16, F32, from_f16, jit_loops, jit_view, np_dtype, same_start, scratch,
                    via_f32, without_out)
from .registry import kernel

_K = np.float32(np.sqrt(2.0 / np.pi))
_C = np.float32(0.044715)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x * x
    t *= _C * x
    t += x
    t *= _K
    np.tanh(t, out=t)
    t += 1
    t *= x
    t *= 0.5
    return t


def gelu_tanh_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    x2 = x * x
    inner = (x2 * _C + 1) * x * _K
    th = np.tanh(inner)
    dinner = (x2 * (3 * _C) + 1) * _K
    # d/dx 0.5 x (1 + tanh(u)) = 0.5 (1 + tanh) + 0.5 x (1 - tanh^2) u'
    sech2 = 1 - th * th
    g = 0.5 * (1 + th) + 0.5 * x * sech2 * dinner
    g *= dy
    return g


def _gelu_block(x: np.ndarray, t: np.ndarray) -> None:
    """`gelu_tanh(x)` into `t` (float32 blocks; t must not overlap x)."""
    u = scratch("gelu_u", x.size).reshape(x.shape)
    np.multiply(x, x, out=t)
    np.multiply(_C, x, out=u)
    t *= u
    t += x
    t *= _K
    np.tanh(t, out=t)
    t += 1
    t *= x
    t *= 0.5


def _gelu_grad_block(dy: np.ndarray, x: np.ndarray, g: np.ndarray) -> None:
    """`gelu_tanh_grad(dy, x)` into `g` (float32 blocks; g may be dy's memory, not x's)."""
    n = x.size
    x2 = scratch("gelu_x2", n).reshape(x.shape)
    th = scratch("gelu_th", n).reshape(x.shape)
    d = scratch("gelu_d", n).reshape(x.shape)
    e = scratch("gelu_e", n).reshape(x.shape)
    np.multiply(x, x, out=x2)
    np.multiply(x2, _C, out=th)                 # inner = (x2 * C + 1) * x * K
    th += 1
    th *= x
    th *= _K
    np.tanh(th, out=th)
    np.multiply(x2, 3 * _C, out=x2)             # dinner = (x2 * 3C + 1) * K
    x2 += 1
    x2 *= _K
    np.add(1, th, out=d)                        # 0.5 * (1 + th)
    d *= 0.5
    np.multiply(th, th, out=th)                 # sech2 = 1 - th * th
    np.subtract(1, th, out=th)
    np.multiply(0.5, x, out=e)                  # 0.5 * x * sech2 * dinner
    e *= th
    e *= x2
    d += e
    np.multiply(d, dy, out=g)


def _all_f16(arrays, dt: np.dtype) -> bool:
    """Whether a float16 kernel's blocks go to its compiled loops as they are (uint16 views: the
    loops convert as they load and round as they store): every array float16, loops present."""
    return dt == F16 and all(a.dtype == F16 for a in arrays) and jit_loops() is not None


def _elementwise(block_fn: Callable, dt: np.dtype, shape, may_alias: bool = False,
                 f16_loops: bool = False):
    """A kernel running `block_fn(*float32 input blocks, float32 result block)` block by block
    over same-shaped inputs, rounding each block into the output dtype. `may_alias`: block_fn
    accepts a result block that is an input block's memory (else such a block is computed in
    scratch first: the memory plan may give the output an input's buffer). `f16_loops`:
    block_fn's compiled loops also take float16 blocks (`_jit_ew`), given them when every array
    is float16."""

    def run(*arrays, out=None):
        res = out_array(out, shape, dt)
        flat_in = [a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
                   for a in arrays]
        flat_out = res.reshape(-1)
        if f16_loops and may_alias and _all_f16(arrays, dt):
            ins16 = [jit_view(a) for a in flat_in]
            out16 = jit_view(flat_out)
            each_range(elem_blocks(flat_out.size),
                       lambda lo, hi: block_fn(*[a[lo:hi] for a in ins16], out16[lo:hi]))
            return res

        def block(lo: int, hi: int) -> None:
            blk = [as_f32(a[lo:hi], f"ew_in{i}") for i, a in enumerate(flat_in)]
            o = flat_out[lo:hi]
            work = f32_work(o, "ew_out", hi - lo)
            if not may_alias and work is o and any(same_start(b, o) for b in blk):
                work = scratch("ew_out", hi - lo)
            block_fn(*blk, work)
            store(work, o)
        each_range(elem_blocks(flat_out.size), block)
        return res
    return run


def _fusable(ins, outs) -> bool:
    """The fused kernels compute float32 and float16 tensors (others run the definitions)."""
    return all(np_dtype(t) in (F16, F32) for t in list(ins) + list(outs))


def _gelu_block_jit(x: np.ndarray, y: np.ndarray) -> None:
    """`_gelu_block` with its passes around tanh compiled (the same operations: same bits)."""
    jit = jit_loops() if x.size > 0 else None
    if jit is None:
        if same_start(y, x):
            t = scratch("ew_out", x.size)
            _gelu_block(x, t)
            y[...] = t
        else:
            _gelu_block(x, y)
        return
    u = scratch("gelu_u", x.size)
    jit.gelu_inner(x, u)
    np.tanh(u, out=u)
    if same_start(y, x):
        jit.gelu_outer_into(y, u)
    else:
        jit.gelu_outer(x, u, y)


def _gelu_grad_block_jit(dy: np.ndarray, x: np.ndarray, g: np.ndarray) -> None:
    jit = jit_loops() if x.size > 0 else None
    if jit is None:
        _gelu_grad_block(dy, x, g)
        return
    x2 = scratch("gelu_x2", x.size)
    u = scratch("gelu_th", x.size)
    jit.gelu_grad_inner(x, x2, u)
    np.tanh(u, out=u)
    into_dy = same_start(g, dy)
    if into_dy or same_start(g, x):       # g is dy's or x's own memory
        jit.gelu_grad_outer_into(dy, x, x2, u, into_dy)
    else:
        jit.gelu_grad_outer(dy, x, x2, u, g)


@kernel("Gelu", writes_out=True, inplace=True)
def _gelu(attrs, ins, outs):
    if not _fusable(ins, outs):
        return without_out(via_f32(gelu_tanh, np_dtype(outs[0])))
    return _elementwise(_gelu_block_jit, np_dtype(outs[0]), outs[0].shape, may_alias=True,
                        f16_loops=True)


@kernel("GeluInplace", modifies=(0,))
def _gelu_inplace(attrs, ins, outs):
    f = via_f32(gelu_tanh, np_dtype(outs[0]))

    def run(x):
        x[...] = f(x)
        return x
    return run


@kernel("GeluGrad", writes_out=True, inplace=True)
def _gelu_grad(attrs, ins, outs):
    if not _fusable(ins, outs):
        return without_out(via_f32(gelu_tanh_grad, np_dtype(outs[0])))
    return _elementwise(_gelu_grad_block_jit, np_dtype(outs[0]), outs[0].shape, may_alias=True,
                        f16_loops=True)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = x - np.max(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def softmax_grad(dy: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    g = dy * y
    g -= y * np.sum(g, axis=axis, keepdims=True)
    return g


def _rowwise(block_fn: Callable, fallback: Callable, axis: int, shape, dt: np.dtype,
             f16_block: Callable = None):
    """A kernel over rows of the last axis: `block_fn(*float32 (rows, n) input blocks, result
    block)` on C-contiguous inputs (other layouts and axes run `fallback` in float32).
    `f16_block(*uint16 row blocks, uint16 result block)`: the same with every array float16,
    through the compiled loops."""
    rank = len(shape)
    row_len = shape[-1] if shape else 1
    last = axis in (-1, rank - 1)

    def run(*arrays, out=None):
        res = out_array(out, shape, dt)
        rows_in = [contiguous_rows(a, row_len) for a in arrays] if last else [None]
        if any(r is None for r in rows_in) or not res.flags.c_contiguous:
            r = fallback(*[from_f16(a) if a.dtype == F16 else a for a in arrays])
            store(np.asarray(r, F32) if dt == F16 else r, res)
            return res
        rows_out = res.reshape(-1, row_len)
        if f16_block is not None and _all_f16(arrays, dt):
            ins16 = [jit_view(a) for a in rows_in]
            out16 = jit_view(rows_out)
            each_range(row_blocks(rows_out.shape[0], row_len),
                       lambda r0, r1: f16_block(*[a[r0:r1] for a in ins16], out16[r0:r1]))
            return res

        def block(r0: int, r1: int) -> None:
            blk = [as_f32(a[r0:r1], f"row_in{i}") for i, a in enumerate(rows_in)]
            o = rows_out[r0:r1]
            work = f32_work(o, "row_out", o.size)
            block_fn(*blk, work)
            store(work, o)
        each_range(row_blocks(rows_out.shape[0], row_len), block)
        return res
    return run


def _softmax_block(x: np.ndarray, e: np.ndarray) -> None:
    jit = jit_loops() if x.size > 0 and e.flags.c_contiguous else None
    if jit is not None:                  # the passes around exp compiled, row by row
        c = x.shape[-1]
        jit.softmax_shift_rows(x.reshape(-1), e.reshape(-1), c)
        np.exp(e, out=e)
        jit.softmax_scale_rows(e.reshape(-1), c)
        return
    m = scratch("softmax_m", x.shape[0]).reshape(-1, 1)
    np.maximum.reduce(x, axis=-1, keepdims=True, out=m)        # np.max, np.sum without
    np.subtract(x, m, out=e)                                   # their Python wrappers
    np.exp(e, out=e)
    np.add.reduce(e, axis=-1, keepdims=True, out=m)
    e /= m


def _softmax_block16(x: np.ndarray, y: np.ndarray) -> None:
    """`_softmax_block` on float16 rows (uint16 views; y may be x's buffer): x converted as the
    shift pass loads it, the quotients rounded as they are stored."""
    jit = jit_loops()
    c = x.shape[-1]
    e = scratch("row_out", x.size)
    jit.softmax_shift_rows(x.reshape(-1), e, c)
    np.exp(e, out=e)
    jit.softmax_scale_rows_to(e, y.reshape(-1), c)


def _softmax_grad_block16(dy: np.ndarray, y: np.ndarray, g: np.ndarray) -> None:
    """`_softmax_grad_block` on float16 rows (uint16 views; g may be dy's buffer)."""
    c = y.shape[-1]
    jit_loops().softmax_grad_rows_to(dy.reshape(-1), y.reshape(-1), scratch("softmax_t", c),
                                     g.reshape(-1), c)


def _softmax_grad_block(dy: np.ndarray, y: np.ndarray, g: np.ndarray) -> None:
    jit = jit_loops() if y.size > 0 and g.flags.c_contiguous else None
    if jit is not None:                  # the same passes, row by row, compiled
        jit.softmax_grad_rows(dy.reshape(-1), y.reshape(-1), g.reshape(-1), y.shape[-1])
        return
    s = scratch("softmax_s", y.shape[0]).reshape(-1, 1)
    t = scratch("softmax_t", y.size).reshape(y.shape)
    np.multiply(dy, y, out=g)
    np.add.reduce(g, axis=-1, keepdims=True, out=s)
    np.multiply(y, s, out=t)
    g -= t


@kernel("Softmax", writes_out=True, inplace=True)
def _softmax(attrs, ins, outs):
    axis = int(attrs["axis"])
    if not _fusable(ins, outs):
        return without_out(via_f32(lambda x: softmax(x, axis), np_dtype(outs[0])))
    return _rowwise(_softmax_block, lambda x: softmax(x, axis), axis, outs[0].shape,
                    np_dtype(outs[0]), _softmax_block16)


@kernel("SoftmaxGrad", writes_out=True, inplace=(0,))
def _softmax_grad(attrs, ins, outs):
    axis = int(attrs["axis"])
    if not _fusable(ins, outs):
        return without_out(via_f32(lambda dy, y: softmax_grad(dy, y, axis), np_dtype(outs[0])))
    return _rowwise(_softmax_grad_block, lambda dy, y: softmax_grad(dy, y, axis), axis,
                    outs[0].shape, np_dtype(outs[0]), _softmax_grad_block16)

