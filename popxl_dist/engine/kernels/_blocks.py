"""Helpers of the fused element-wise kernels: work block by block so temporaries stay in cache.

A fused kernel runs the same NumPy operations, in the same order and on the same float32 values,
as its unfused definition, but on blocks of a few thousand elements (whole rows for row-wise
kernels: softmax, norms) with reusable scratch arrays and the result written straight into the
output (a memory-plan buffer when the compiler gives one). Element-wise results do not depend on
where an element sits in a block, and row reductions see the same row, so the bits are those of the
unfused definition (the tests compare them). float16 operands are converted a block at a time with
the fast converters of `_util` (never NumPy's slow float16 subnormal path).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np

from ._util import F16, F32, from_f16, scratch, to_f16

__all__ = ["BLOCK", "elem_blocks", "row_blocks", "as_f32", "store", "contiguous_rows"]

BLOCK = 1 << 17      # elements per block: large enough that NumPy's per-call cost is small


def elem_blocks(n: int, block: int = 0) -> Iterator[Tuple[int, int]]:
    """`(lo, hi)` element ranges covering n."""
    block = block or BLOCK
    for lo in range(0, n, block):
        yield lo, min(lo + block, n)


def row_blocks(rows: int, row_len: int, block: int = 0) -> Iterator[Tuple[int, int]]:
    """`(r0, r1)` row ranges covering `rows` rows of `row_len`, about `block` elements each."""
    step = max(1, (block or BLOCK) // max(row_len, 1))
    for r0 in range(0, rows, step):
        yield r0, min(r0 + step, rows)


def as_f32(a: np.ndarray, tag: str) -> np.ndarray:
    """`a` as float32: itself when it already is, else converted into scratch `tag`."""
    if a.dtype == F32:
        return a
    buf = scratch(tag, a.size).reshape(a.shape)
    if a.dtype == F16:
        np.take(_F16_TABLE(), a.view(np.uint16), out=buf)
    else:
        buf[...] = a
    return buf


def _F16_TABLE() -> np.ndarray:
    from . import _util

    return _util._F16_TO_F32


def store(res: np.ndarray, out: np.ndarray) -> None:
    """Write a float32 block result into `out` (float16 rounded with the fast converter)."""
    if res is out:
        return
    if out.dtype == F16:
        to_f16(res, out)
    else:
        out[...] = res


def contiguous_rows(a: np.ndarray, row_len: int) -> Optional[np.ndarray]:
    """A C-contiguous array as a 2-D (rows, row_len) view, else None."""
    if not a.flags.c_contiguous or row_len == 0 or a.size % row_len:
        return None
    return a.reshape(-1, row_len)


def out_array(out: Optional[np.ndarray], shape, dtype) -> np.ndarray:
    """The preallocated output, or a new one."""
    return np.empty(shape, dtype) if out is None else out


def f32_work(out: np.ndarray, tag: str, n: int) -> np.ndarray:
    """Where a block's float32 result is computed: the output block itself when it is float32,
    else scratch (then `store` rounds it into the output)."""
    if out.dtype == F32:
        return out
    return scratch(tag, n).reshape(out.shape)


__all__ += ["out_array", "f32_work", "from_f16"]
