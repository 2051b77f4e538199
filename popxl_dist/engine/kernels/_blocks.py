"""Helpers of the fused element-wise kernels: work block by block so temporaries stay in cache.

A fused kernel runs the same NumPy operations, in the same order and on the same float32 values,
as its unfused definition, but on blocks of a few thousand elements (whole rows for row-wise
kernels: softmax, norms) with reusable scratch arrays and the result written straight into the
output (a memory-plan buffer when the compiler gives one). Element-wise results do not depend on
where an element sits in a block, and row reductions see the same row, so the bits are those of the
unfused definition (the tests compare them). float16 operands are converted a block at a time with
the fast converters of `_util` (never NumPy's slow float16 subnormal path).

Blocks are independent, so `each_range` runs them on the op's threads (`engine/parallel.py`):
the blocks depend on the shapes only, and a block computes the same whichever thread runs it.
Work that is one call without threads (`shared`, `shared_rows`, the copies and column sums
here) stays one call on one thread, with the same results.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Tuple

import numpy as np

from ..parallel import current_threads, run_blocks
from ._util import (F16, F32, f16_into, from_f16, jit_loops, jit_view, same_start, scratch,
                    to_f16)

__all__ = ["BLOCK", "elem_blocks", "row_blocks", "shared", "shared_rows", "each_range", "as_f32", "store",
           "contiguous_rows", "column_sums", "binary_blocks", "copy_into"]

BLOCK = 1 << 17      # elements per block: large enough that NumPy's per-call cost is small


def elem_blocks(n: int, block: int = 0) -> Iterator[Tuple[int, int]]:
    """`(lo, hi)` element ranges covering n."""
    block = block or BLOCK
    if 0 < n <= block:               # one block: no generator (small tensors, many calls)
        return ((0, n),)
    return _ranges(n, block)


def _ranges(n: int, block: int) -> Iterator[Tuple[int, int]]:
    for lo in range(0, n, block):
        yield lo, min(lo + block, n)


def row_blocks(rows: int, row_len: int, block: int = 0) -> Iterator[Tuple[int, int]]:
    """`(r0, r1)` row ranges covering `rows` rows of `row_len`, about `block` elements each."""
    step = max(1, (block or BLOCK) // max(row_len, 1))
    if 0 < rows <= step:             # one block: no generator (small tensors, many calls)
        return ((0, rows),)
    return _ranges(rows, step)


def shared(n: int) -> Iterable[Tuple[int, int]]:
    """Element ranges of work that is one call on one thread: (0, n) there, `elem_blocks(n)`
    for several threads (element-wise work: the same results either way)."""
    return ((0, n),) if n <= BLOCK or current_threads() < 2 else elem_blocks(n)


def shared_rows(rows: int, row_len: int) -> Iterable[Tuple[int, int]]:
    """`shared` for whole rows: all of them on one thread, `row_blocks` for several."""
    if rows * row_len <= BLOCK or current_threads() < 2:
        return ((0, rows),)
    return row_blocks(rows, row_len)


def each_range(ranges: Iterable[Tuple[int, int]], body: Callable[[int, int], None]) -> None:
    """`body(lo, hi)` for every range, on the op's threads (one range: here, directly). Each
    body writes its own part of the output; scratch arrays are per thread (`_util.scratch`)."""
    r = ranges if isinstance(ranges, tuple) else tuple(ranges)
    if len(r) == 1:
        body(*r[0])
        return
    run_blocks(len(r), lambda i: body(*r[i]))


def as_f32(a: np.ndarray, tag: str) -> np.ndarray:
    """`a` as float32: itself when it already is, else converted into scratch `tag` (a large
    contiguous float16 array in element blocks on the op's threads)."""
    if a.dtype == F32:
        return a
    buf = scratch(tag, a.size).reshape(a.shape)
    if a.dtype == F16:
        if a.size > BLOCK and a.flags.c_contiguous and current_threads() > 1:
            fa, fb = a.reshape(-1), buf.reshape(-1)
            each_range(elem_blocks(a.size), lambda lo, hi: f16_into(fa[lo:hi], fb[lo:hi]))
        else:
            f16_into(a, buf)
    else:
        buf[...] = a
    return buf


def copy_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """`np.copyto(dst, src)` (same shapes), a large one in blocks of the leading axis on the
    op's threads."""
    n = dst.size
    if (n <= BLOCK or dst.ndim == 0 or dst.shape[0] < 2 or src.shape != dst.shape
            or current_threads() < 2):
        np.copyto(dst, src)
        return dst
    each_range(row_blocks(dst.shape[0], n // dst.shape[0]),
               lambda lo, hi: np.copyto(dst[lo:hi], src[lo:hi]))
    return dst


def column_sums(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`np.sum(x, axis=0, out=out)` of a 2-D array, on one thread: the sum is bound by memory
    bandwidth, and NumPy's sums of column blocks measured 1.5-9x slower than the whole sum on
    two threads. (A compiled loop was 1.2-2x faster but gives other NaN sign bits: LLVM may
    swap the operands of an add.)"""
    return np.sum(x, axis=0, out=out)


def store(res: np.ndarray, out: np.ndarray) -> None:
    """Write a float32 block result into `out` (float16 rounded with the fast converter; a
    large contiguous one in element blocks on the op's threads)."""
    if res is out:
        return
    if out.dtype == F16:
        if (out.size > BLOCK and out.flags.c_contiguous and res.flags.c_contiguous
                and current_threads() > 1):
            fr, fo = res.reshape(-1), out.reshape(-1)
            each_range(elem_blocks(out.size), lambda lo, hi: to_f16(fr[lo:hi], fo[lo:hi]))
        else:
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


def _suffix_size(shape, out_shape) -> Optional[int]:
    """Elements of an operand that broadcasts as a suffix of `out_shape` (leading 1s dropped):
    the operand repeats every that many output elements; None for other broadcasts."""
    s = tuple(shape)
    while s and s[0] == 1:
        s = s[1:]
    if s and tuple(out_shape[len(out_shape) - len(s):]) != s:
        return None
    n = 1
    for d in s:
        n *= d
    return n


def _same_buffer(out: np.ndarray, x: np.ndarray) -> bool:
    """Whether 1-D contiguous `x` is `out`'s own memory (a buffer the memory plan handed over, or
    an in-place op); other overlaps are not expected: `out` is then fresh memory."""
    return x.size == out.size and same_start(x, out)


_JIT_OPS = {np.add: 0, np.subtract: 1, np.multiply: 2}     # `_jit_ew.binary_rows`'s op codes


def binary_f32(ufunc, a_shape, b_shape, out_shape, out_dtype) -> Optional[object]:
    """`ufunc(a, b)` computed in float32 on float16 / float32 operands and rounded once to
    `out_dtype`, block by block (rows of the broadcast operand), into `out` when given; None
    when the broadcast is not an operand repeating as a suffix of the output."""
    n = 1
    for d in out_shape:
        n *= d
    ka, kb = _suffix_size(a_shape, out_shape), _suffix_size(b_shape, out_shape)
    if ka is None or kb is None or (ka != n and kb != n):
        return None
    k = min(ka, kb) or 1           # the row length: the smaller operand repeats every k
    if ka == kb == n and out_shape:
        k = out_shape[-1] or 1     # neither repeats: rows of the output (blocks of rows)
    rows = n // k if k else 0
    op = _JIT_OPS.get(ufunc)

    def run(a, b, out=None):
        res = np.empty(out_shape, out_dtype) if out is None else out
        jit = jit_loops() if op is not None and n and res.flags.c_contiguous else None
        if jit is not None:                     # one compiled pass, float16 read and written
            af = jit_view(np.ascontiguousarray(a).reshape(-1))
            bf = jit_view(np.ascontiguousarray(b).reshape(-1))
            of = jit_view(res.reshape(-1))

            def rows_of(x: np.ndarray, whole: bool, r0: int, r1: int) -> np.ndarray:
                return x[r0 * k:r1 * k] if whole else x

            if _same_buffer(of, af):
                def block(r0: int, r1: int) -> None:
                    jit.binary_rows_into(op, of[r0 * k:r1 * k], rows_of(bf, kb == n, r0, r1),
                                         k, kb != n, True)
            elif _same_buffer(of, bf):
                def block(r0: int, r1: int) -> None:
                    jit.binary_rows_into(op, of[r0 * k:r1 * k], rows_of(af, ka == n, r0, r1),
                                         k, ka != n, False)
            else:
                def block(r0: int, r1: int) -> None:
                    jit.binary_rows(op, rows_of(af, ka == n, r0, r1), rows_of(bf, kb == n, r0, r1),
                                    of[r0 * k:r1 * k], k, ka != n, kb != n)
            each_range(shared_rows(rows, k), block)
            return res
        a2 = np.ascontiguousarray(a).reshape(-1, ka if ka != n else k) if n else a
        b2 = np.ascontiguousarray(b).reshape(-1, kb if kb != n else k) if n else b
        if ka != n:
            a2 = as_f32(a2, "bin_a_row")
        if kb != n:
            b2 = as_f32(b2, "bin_b_row")
        o2 = res.reshape(rows, k)

        def block(r0: int, r1: int) -> None:
            ab = a2[r0:r1] if ka == n else a2
            bb = b2[r0:r1] if kb == n else b2
            ab = as_f32(ab, "bin_a") if ka == n else ab
            bb = as_f32(bb, "bin_b") if kb == n else bb
            o = o2[r0:r1]
            w = f32_work(o, "bin_w", o.size)
            ufunc(ab, bb, out=w)
            store(w, o)
        each_range(row_blocks(rows, k), block)
        return res
    return run


def binary_blocks(ufunc, in_shapes, out_shape) -> object:
    """`ufunc(a, b, out=out)` (operands and output of one dtype) in blocks of output rows on
    the op's threads where the output is large; element-wise, so the bits are the whole call's.
    Blocks split the output's first axis (an operand without that axis, or with extent 1 there,
    is broadcast to every block), or the flat elements when every operand has the output's
    shape."""
    n = 1
    for d in out_shape:
        n *= d
    if n <= BLOCK or not out_shape:
        return ufunc
    same = all(tuple(s) == tuple(out_shape) for s in in_shapes)
    lead = out_shape[0]
    split = [len(s) == len(out_shape) and s[0] == lead for s in in_shapes]
    if not same and lead < 2:
        return ufunc

    def run(*arrays, out=None):
        if out is None or not out.flags.c_contiguous or current_threads() < 2:
            return ufunc(*arrays, out=out)
        if same and all(x.flags.c_contiguous for x in arrays):
            flats = [x.reshape(-1) for x in arrays]
            of = out.reshape(-1)
            each_range(elem_blocks(n), lambda lo, hi: ufunc(*[x[lo:hi] for x in flats],
                                                            out=of[lo:hi]))
            return out
        each_range(row_blocks(lead, n // lead),
                   lambda lo, hi: ufunc(*[x[lo:hi] if cut else x for x, cut in zip(arrays, split)],
                                        out=out[lo:hi]))
        return out
    return run
