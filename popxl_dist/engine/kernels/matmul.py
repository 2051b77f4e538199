"""Kernel: MatMul with IPU-like float16 partials (accumulate in float32, round once)."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, cast, np_dtype
from .registry import kernel


@kernel("MatMul")
def _matmul(attrs, ins, outs):
    if len(ins) == 3:
        return _matmul_pow2scaled(ins, outs)
    out = np_dtype(outs[0])
    a_dt, b_dt = np_dtype(ins[0]), np_dtype(ins[1])
    if a_dt == F16 or b_dt == F16 or out == F16:
        def run16(a, b):
            r = np.matmul(a if a.dtype == F32 else cast(a, F32),
                          b if b.dtype == F32 else cast(b, F32))
            return r if out == F32 else cast(r, out)
        return run16
    if out.kind in "iu":
        return lambda a, b: np.matmul(a, b).astype(out, copy=False)
    if out != a_dt:
        return lambda a, b: np.matmul(a, b).astype(out)
    return np.matmul


def _matmul_pow2scaled(ins, outs):
    """float8 (lhs, rhs, log2_scale): np.matmul of the decoded values in float32, scaled by
    2^log2_scale, rounded once to the output dtype (float16)."""
    from .float8 import pow2scaled

    return pow2scaled(np.matmul, ins, outs, "MatMul")
