"""Kernel: MatMul with IPU-like float16 partials (accumulate in float32, round once)."""
from __future__ import annotations

import numpy as np

from ._blocks import as_f32, store
from ._matmul_blocks import matmul as blocked_matmul
from ._util import F16, F32, cast, cast_into, np_dtype, scratch, to_f16, without_out
from .registry import kernel


@kernel("MatMul", writes_out=True, settings=True)
def _matmul(attrs, ins, outs, env=None):
    if len(ins) == 3:
        return without_out(_matmul_pow2scaled(ins, outs, env))
    out = np_dtype(outs[0])
    a_dt, b_dt = np_dtype(ins[0]), np_dtype(ins[1])
    if a_dt == F16 or b_dt == F16 or out == F16:
        shape = outs[0].shape
        n = int(np.prod(shape, dtype=np.int64))

        gemm = len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1 and \
            len(ins[0].shape) >= 2 and len(ins[1].shape) >= 2

        def run16(a, b, out=None):
            """float16 operands converted into scratch, multiplied in float32 (the IPU's
            partials), rounded once into the output."""
            a32 = _operand_f32(a, "mm_a", gemm)
            b32 = _operand_f32(b, "mm_b", gemm)
            if out_dt == F32:
                return blocked_matmul(a32, b32, out)
            r = blocked_matmul(a32, b32, scratch("mm_r", n).reshape(shape))
            if out is None:
                return to_f16(r)
            store(r, out)                 # (a large result rounded in blocks on the op's threads)
            return out
        out_dt = out
        if all(d in (F16, F32) for d in (a_dt, b_dt, out)):
            return run16

        def run_other(a, b, out=None):
            a32 = a if a.dtype == F32 else cast(a, F32)
            b32 = b if b.dtype == F32 else cast(b, F32)
            return cast_into(np.matmul(a32, b32), out_dt, out)
        return run_other
    if out.kind in "iu":
        return without_out(lambda a, b: np.matmul(a, b).astype(out, copy=False))
    if out != a_dt or out != b_dt:
        return without_out(lambda a, b: np.matmul(a, b).astype(out))
    return blocked_matmul


def _operand_f32(a: np.ndarray, tag: str, gemm: bool) -> np.ndarray:
    """A matmul operand as float32 in scratch. A transposed or permuted view (`x.T` of a weight
    gradient, attention's heads) of a contiguous float16 array is converted in its own memory
    order and passed on as the same view, as float32 operands are: BLAS then reads it in place,
    with the same bits as from a copy (GEMM packs its operands; only matrix-vector products, M
    or N = 1, depend on the layout and take the copy)."""
    if gemm and a.dtype == F16 and not a.flags.c_contiguous and a.ndim >= 2:
        dense = _dense_view(a)
        if dense is not None:
            t, inverse = dense
            return as_f32(t, tag).transpose(inverse)
    return as_f32(a, tag)


def _dense_view(a: np.ndarray):
    """`(a as the C-contiguous array it is a permuted view of, the axis order that gives a back
    from it)` (e.g. attention's heads split off and moved), if a's matrices are still read by
    BLAS directly (one of the last two axes has unit stride), else None."""
    if a.itemsize not in (a.strides[-1], a.strides[-2]):
        return None
    perm = sorted(range(a.ndim), key=lambda i: -a.strides[i])
    t = a.transpose(perm)
    if not t.flags.c_contiguous:
        return None
    return t, sorted(range(a.ndim), key=perm.__getitem__)


def _matmul_pow2scaled(ins, outs, env):
    """float8 (lhs, rhs, log2_scale): np.matmul of the decoded values in float32, scaled by
    2^log2_scale, rounded once to the output dtype (float16)."""
    from .float8 import pow2scaled

    return pow2scaled(np.matmul, ins, outs, "MatMul", env)
