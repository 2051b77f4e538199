"""Kernel: MatMul with IPU-like float16 partials (accumulate in float32, round once)."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, cast, cast_into, np_dtype, without_out
from .registry import kernel


@kernel("MatMul", writes_out=True)
def _matmul(attrs, ins, outs):
    if len(ins) == 3:
        return without_out(_matmul_pow2scaled(ins, outs))
    out = np_dtype(outs[0])
    a_dt, b_dt = np_dtype(ins[0]), np_dtype(ins[1])
    if a_dt == F16 or b_dt == F16 or out == F16:
        def run16(a, b, out=None):
            a32 = a if a.dtype == F32 else cast(a, F32)
            b32 = b if b.dtype == F32 else cast(b, F32)
            if out_dt == F32:
                return np.matmul(a32, b32, out=out)
            return cast_into(np.matmul(a32, b32), out_dt, out)
        out_dt = out
        return run16
    if out.kind in "iu":
        return without_out(lambda a, b: np.matmul(a, b).astype(out, copy=False))
    if out != a_dt or out != b_dt:
        return without_out(lambda a, b: np.matmul(a, b).astype(out))
    return np.matmul


def _matmul_pow2scaled(ins, outs):
    """float8 (lhs, rhs, log2_scale): np.matmul of the decoded values in float32, scaled by
    2^log2_scale, rounded once to the output dtype (float16)."""
    from .float8 import pow2scaled

    return pow2scaled(np.matmul, ins, outs, "MatMul")
