"""Graphcore's float8 formats on NumPy: exact encoding to and decoding from uint8 codes.

Both formats are sign / exponent / mantissa with subnormals and no infinities; the one code of
"negative zero", 0x80, is the only NaN (Graphcore's and IEEE P3109's convention):

* ``float8_143``: 1-4-3, exponent bias 8, largest 0x7F = 2^7 * 1.875 = 240, smallest 2^-10.
* ``float8_152``: 1-5-2, exponent bias 16, largest 0x7F = 2^15 * 1.75 = 57344, smallest 2^-17.

Encoding computes ``x * 2^log2_scale`` exactly (float64), rounds to the nearest representable
value with ties to even, and maps a result whose magnitude rounds above the largest value (and
+-inf) to NaN (``nan_on_overflow``) or to +-largest. NaN encodes as 0x80; -0 and negative values
that round to zero encode as +0 (0x00), since 0x80 is NaN.

Used by the host casts (`popxl.fp8_utils`), the cast kernels, and the float8 matmul/conv kernels.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

__all__ = ["Float8Format", "FORMATS", "NAN_CODE", "format_of", "encode", "encode_exact", "decode",
           "decode_table", "mse_scale", "check_log2_scale", "LOG2_SCALE_RANGE",
           "MSE_SCALE_RANGE"]

NAN_CODE = 0x80
# upstream: log2_scale must lie in [-32, 32); the scale searches use [-31, 31]
LOG2_SCALE_RANGE = (-32, 32)
MSE_SCALE_RANGE = (-31, 31)


class Float8Format(NamedTuple):
    """A sign-exponent-mantissa 8-bit format with subnormals, no infinities and NaN = 0x80."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias

    @property
    def max_exp(self) -> int:
        return (1 << self.exp_bits) - 1 - self.bias

    @property
    def max_value(self) -> float:
        return float(np.ldexp(2.0 - 2.0 ** -self.man_bits, self.max_exp))

    @property
    def min_subnormal(self) -> float:
        return float(np.ldexp(1.0, self.min_normal_exp - self.man_bits))


FORMATS = {"float8_143": Float8Format("float8_143", 4, 3, 8),
           "float8_152": Float8Format("float8_152", 5, 2, 16)}


def format_of(name: str) -> Float8Format:
    """The format of a float8 dtype name ('float8_143' or 'float8_152')."""
    return FORMATS[name]


def check_log2_scale(log2_scale, what: str) -> int:
    """`log2_scale` as an int in [-32, 32), else a ValueError/TypeError naming `what`."""
    if isinstance(log2_scale, (bool, np.bool_)) or not isinstance(
            log2_scale, (int, np.integer)) and not (
            isinstance(log2_scale, np.ndarray) and log2_scale.size == 1
            and log2_scale.dtype.kind in "iu"):
        raise TypeError(f"{what}: log2_scale must be an integer, got {log2_scale!r}")
    s = int(np.asarray(log2_scale).reshape(()))
    lo, hi = LOG2_SCALE_RANGE
    if not lo <= s < hi:
        raise ValueError(f"{what}: log2_scale must lie in [{lo}, {hi}), got {s}")
    return s


@lru_cache(maxsize=None)
def decode_table(fmt: Float8Format) -> np.ndarray:
    """float32 value of each of the 256 codes (read-only)."""
    codes = np.arange(256)
    m = fmt.man_bits
    mant = codes & ((1 << m) - 1)
    expf = (codes >> m) & ((1 << fmt.exp_bits) - 1)
    sub = expf == 0
    sig = np.where(sub, mant, mant + (1 << m)).astype(np.float64)
    exp = np.where(sub, fmt.min_normal_exp, expf - fmt.bias) - m
    vals = np.ldexp(sig, exp)
    vals = np.where(codes & 0x80, -vals, vals)
    vals[NAN_CODE] = np.nan
    table = vals.astype(np.float32)
    table.setflags(write=False)
    return table


def decode(codes: np.ndarray, fmt: Float8Format) -> np.ndarray:
    """float32 values of uint8 `codes` (exact: every float8 value is a float32)."""
    return decode_table(fmt)[np.asarray(codes, dtype=np.uint8)]


def _round(x: np.ndarray, fmt: Float8Format):
    """(|x| rounded to nearest even in units of the format's spacing at |x|, the binade
    exponent of |x|) for float64 `x`."""
    a = np.abs(x)
    _, k = np.frexp(a)
    e = np.maximum(k - 1, fmt.min_normal_exp)
    q = e - fmt.man_bits
    r = np.rint(np.ldexp(a, -q))
    return r, e


def encode_exact(x, fmt: Float8Format, log2_scale: int = 0,
                 nan_on_overflow: bool = True) -> np.ndarray:
    """uint8 codes of `x * 2^log2_scale`, computed in float64 arithmetic (the definition;
    `encode` is the fast equivalent)."""
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.ldexp(np.asarray(x, dtype=np.float64), int(log2_scale))
        m = fmt.man_bits
        r, e = _round(x, fmt)
        nan = np.isnan(x)
        over = ~nan & ~(np.ldexp(r, e - m) <= fmt.max_value)
    r = np.where(nan | over, 0.0, r)
    bump = r >= (1 << (m + 1))                    # rounding carried into the next binade
    r = np.where(bump, r * 0.5, r)
    e = e + bump
    ri = r.astype(np.int64)
    normal = ri >= (1 << m)
    code = np.where(normal, ((e + fmt.bias) << m) | (ri - (1 << m)), ri)
    code = np.where((code != 0) & np.signbit(x), code | 0x80, code)
    if over.any():
        code = np.where(over, NAN_CODE if nan_on_overflow else (0x7F | (np.signbit(x) << 7)),
                        code)
    code = np.where(nan, NAN_CODE, code)
    return code.astype(np.uint8)


# Fast encoding by table lookup on the top 16 bits of the IEEE pattern (sign, exponent and
# the leading mantissa bits). Every rounding boundary of both formats (a midpoint between
# neighbours, at most 5 significant bits) has zeros below those 16 bits, so inside one bucket
# only its lowest pattern (low bits all zero: possibly a tie) can encode differently from the
# rest; `_tables` keeps one code for it and one for the others.
_FLOATS = {np.dtype(np.float16): (np.uint16, 0), np.dtype(np.float32): (np.uint32, 16),
           np.dtype(np.float64): (np.uint64, 48)}


@lru_cache(maxsize=None)
def _tables(fmt: Float8Format, nan_on_overflow: bool, float_dtype: np.dtype):
    """(codes of each bucket's lowest pattern, codes of its other patterns)."""
    uint, shift = _FLOATS[float_dtype]
    buckets = np.arange(1 << 16, dtype=np.uint64)
    low = (buckets << np.uint64(shift)).astype(uint)
    rest = (low | uint((1 << shift) - 1)) if shift else low
    lut_low = encode_exact(low.view(float_dtype), fmt, 0, nan_on_overflow)
    lut = encode_exact(rest.view(float_dtype), fmt, 0, nan_on_overflow)
    if shift:   # the invariant the lookup relies on
        above = encode_exact((low + uint(1)).view(float_dtype), fmt, 0, nan_on_overflow)
        assert np.array_equal(above, lut), "float8 encoding tables: a boundary inside a bucket"
    for t in (lut_low, lut):
        t.setflags(write=False)
    return lut_low, lut, uint, shift


def encode(x, fmt: Float8Format, log2_scale: int = 0,
           nan_on_overflow: bool = True) -> np.ndarray:
    """uint8 codes of `x * 2^log2_scale` (see the module docstring for rounding and overflow),
    bit for bit `encode_exact`, by table lookup for float16/32/64 input."""
    x = np.asarray(x)
    if x.dtype not in _FLOATS:
        x = x.astype(np.float64)
    if log2_scale:
        if x.dtype == np.float16:
            x = x.astype(np.float32)
        # exact: a power-of-two factor (overflow gives +-inf, which overflows float8 anyway;
        # inexact underflow only below 2^-126, far below half the smallest float8)
        x = x * x.dtype.type(2.0 ** int(log2_scale))
    lut_low, lut, uint, shift = _tables(fmt, bool(nan_on_overflow), x.dtype)
    bits = np.ascontiguousarray(x).reshape(-1).view(uint)
    if not shift:
        return lut[bits].reshape(x.shape)
    bucket = (bits >> uint(shift)).astype(np.intp)
    out = lut[bucket]
    at_low = np.flatnonzero((bits & uint((1 << shift) - 1)) == 0)   # few, unless x is coarse
    if at_low.size:
        out[at_low] = lut_low[bucket[at_low]]
    return out.reshape(x.shape)


def mse_scale(x: np.ndarray, fmt: Float8Format) -> int:
    """The log2 scale s in [-31, 31] minimising the squared error of
    `x ~ decode(encode(x * 2^s, saturating)) * 2^-s`, summed in float64 with NaN terms counted
    as 0; the smallest such s on ties (so an all-zero `x` gives -31)."""
    x = np.asarray(x)
    if x.dtype not in _FLOATS:
        x = x.astype(np.float64)
    flat = x.reshape(-1)
    flat64 = flat.astype(np.float64)
    table = decode_table(fmt)
    lo, hi = MSE_SCALE_RANGE
    best, best_err = lo, np.inf
    for s in range(lo, hi + 1):
        q = table[encode(flat, fmt, s, nan_on_overflow=False)]
        d = q.astype(np.float64) * 2.0 ** -s - flat64
        d[np.isnan(d)] = 0.0
        err = np.sum(d * d)
        if err < best_err:
            best, best_err = s, err
    return best
