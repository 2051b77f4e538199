"""Kernels: the float8 casts Pow2ScaleThenCast / CastThenPow2Scale, and helpers for the
pow2-scaled matmul and convolutions (float8 arrays are uint8 codes)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ... import _float8
from ._util import np_dtype
from .registry import kernel

__all__ = ["runtime_scale", "decoder", "pow2scaled"]


def runtime_scale(s: np.ndarray, op_type: str) -> int:
    """The value of a log2_scale input; ValueError outside [-32, 32)."""
    v = int(s.reshape(()) if isinstance(s, np.ndarray) else s)
    lo, hi = _float8.LOG2_SCALE_RANGE
    if not lo <= v < hi:
        raise ValueError(f"{op_type}: log2_scale must lie in [{lo}, {hi}), got {v}")
    return v


def decoder(info) -> Callable[[np.ndarray], np.ndarray]:
    """codes -> exact float32 values (a new array), for a float8 tensor's TensorInfo."""
    table = _float8.decode_table(_float8.format_of(info.dtype.name))
    return lambda codes: np.asarray(table[codes])


@kernel("Pow2ScaleThenCast")
def _pow2scale_then_cast(attrs, ins, outs):
    fmt = _float8.format_of(outs[0].dtype.name)

    def run(x, s):
        return _float8.encode(x, fmt, runtime_scale(s, "Pow2ScaleThenCast"), True)
    return run


@kernel("CastThenPow2Scale")
def _cast_then_pow2scale(attrs, ins, outs):
    dec = decoder(ins[0])
    out = np_dtype(outs[0])

    def run(codes, s):
        v = dec(codes)
        k = runtime_scale(s, "CastThenPow2Scale")
        if k:
            v *= np.float32(2.0 ** k)        # exact: float8 values times 2^k stay normal
        return v.astype(out, copy=False)
    return run


def pow2scaled(fn: Callable, ins, outs, op_type: str) -> Callable:
    """Kernel for a float8 (a, b, log2_scale) op: `fn` on the exact float32 values of a and b,
    times 2^log2_scale in float32, rounded once to the output dtype."""
    dec_a, dec_b = decoder(ins[0]), decoder(ins[1])
    out = np_dtype(outs[0])

    def run(a, b, s):
        y = fn(dec_a(a), dec_b(b))
        k = runtime_scale(s, op_type)
        if k:
            # as ldexp: exact unless float32 underflow, far below the float16 output's range
            y *= np.float32(2.0 ** k)
        return y.astype(out)
    return run
