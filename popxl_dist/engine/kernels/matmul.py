"""Kernel: MatMul with IPU-like float16 partials (accumulate in float32, round once)."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, cast, np_dtype
from .registry import kernel


@kernel("MatMul")
def _matmul(attrs, ins, outs):
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
