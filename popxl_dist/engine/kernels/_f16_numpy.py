"""The NumPy float16 <-> float32 converters every other one is checked against: float16 ->
float32 by table lookup, float32 -> float16 with integer arithmetic on the bits (NumPy's casts'
bits, NaN payloads included, without their slow per-element underflow path)."""
from __future__ import annotations

import numpy as np

__all__ = ["_F16_TO_F32", "_f32_bits_to_f16"]

_U32 = np.uint32
_F16_TO_F32 = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _f32_bits_to_f16(u: np.ndarray, out: np.ndarray) -> None:
    a = u & _U32(0x7FFFFFFF)                     # |x| bits
    h = (a >> _U32(13)) & _U32(1)                # normal range: round the 23-bit mantissa to
    h += a                                       # 10 bits (half to even) and rebias the
    h += _U32(0xFFF)                             # exponent 127 -> 15 (wraps below 2**-14,
    h >>= _U32(13)                               # where the subnormal formula below applies)
    h -= _U32(112 << 10)
    big = a >= _U32(0x477FF000)                  # rounds to inf, or is inf / NaN (rare)
    any_big = big.any()
    sub = a < _U32(0x38800000)                   # |x| < 2**-14: float16 subnormal or zero
    if sub.any():
        # |x| + 0.5 rounds |x| to a multiple of 2**-24 (half to even); its mantissa bits are
        # then the float16 subnormal bits. Select by arithmetic (np.where is slower).
        if any_big:                              # (signalling NaNs would warn here)
            with np.errstate(invalid="ignore"):
                s = (a.view(np.float32) + np.float32(0.5)).view(_U32)
        else:
            s = (a.view(np.float32) + np.float32(0.5)).view(_U32)
        s -= _U32(0x3F000000)
        s -= h
        s *= sub
        h += s
    if any_big:
        nan = (_U32(0x7C00) + ((a & _U32(0x7FFFFF)) >> _U32(13))).astype(_U32)
        nan[nan == 0x7C00] = 0x7C01              # keep a NaN a NaN (NumPy's payload rule)
        h = np.where(big, np.where(a > _U32(0x7F800000), nan, _U32(0x7C00)), h)
    sign = u >> _U32(16)
    sign &= _U32(0x8000)
    h |= sign
    out[...] = h
