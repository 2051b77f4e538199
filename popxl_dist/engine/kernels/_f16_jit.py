"""The numba loops of `_f16_numba` (imported only through it: importing this imports numba)."""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

__all__ = ["to16", "from16", "trunc16", "load", "put"]

_U32 = np.uint32
_U16 = np.uint16


@intrinsic
def _trunc16(typingctx, x):
    """float32 -> float16 bits: the CPU's conversion (round half to even, subnormals exact)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def _ext16(typingctx, x):
    """float16 bits -> float32 (exact)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@njit(nogil=True, cache=True, error_model="numpy")
def _f32_to_f16(x, bits, out):
    """x (float32) with its bits (uint32 view) -> float16 bits; NaNs as NumPy converts them
    (payload kept, never made quiet): a second pass, only when there is a NaN."""
    nan = False          # tested on the floats: an integer max would widen and not vectorise
    for i in range(x.size):
        v = x[i]
        out[i] = _trunc16(v)
        nan |= v != v
    if nan:
        for i in range(x.size):
            b = bits[i]
            a = b & _U32(0x7FFFFFFF)
            if a > _U32(0x7F800000):
                nan = _U32(0x7C00) | ((a & _U32(0x7FFFFF)) >> _U32(13))
                nan = _U32(0x7C01) if nan == _U32(0x7C00) else nan
                out[i] = _U16(nan | ((b >> _U32(16)) & _U32(0x8000)))


@intrinsic
def _bits(typingctx, x):
    """float32 -> its bits (uint32)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@njit(nogil=True, cache=True, error_model="numpy")
def _f16_to_f32(h, out_bits):
    """float16 bits -> float32 bits (NaNs keep their payload, as NumPy's cast: a second pass,
    only when there is a NaN)."""
    nan = False
    for i in range(h.size):
        v = _ext16(h[i])
        out_bits[i] = _bits(v)
        nan |= v != v
    if nan:
        for i in range(h.size):
            w = _U32(h[i])
            if (w & _U32(0x7FFF)) > _U32(0x7C00):
                out_bits[i] = ((w & _U32(0x8000)) << _U32(16)) | _U32(0x7F800000) | \
                    ((w & _U32(0x3FF)) << _U32(13))


def to16(x: np.ndarray, out: np.ndarray) -> None:
    """1-D contiguous float32 `x` -> float16 bits into `out` (uint16)."""
    _f32_to_f16(x, x.view(np.uint32), out)


def from16(h: np.ndarray, out: np.ndarray) -> None:
    """1-D contiguous float16 bits `h` (uint16) -> float32 into `out`."""
    _f16_to_f32(h, out.view(np.uint32))


# --- float16 inside compiled loops -----------------------------------------------------------
# Loops of `_jit_ew` read and write float16 arrays (passed as uint16 views) element by element
# with `load` / `put`, float32 arrays unchanged: one pass computes in float32 and rounds once.
# `load` / `put` are the CPU's conversions alone, which differ from NumPy's casts only on
# signalling NaNs (the CPU makes them quiet). They serve loops in which every loaded value goes
# through float32 arithmetic before anything is stored: that makes NaNs quiet in NumPy's
# arithmetic too, so the bits are the same.

@njit(nogil=True, cache=True)
def trunc16(v):
    """float32 -> float16 bits, as `to16` (signalling NaNs stay signalling, as NumPy's cast)."""
    if v != v:
        b = _bits(v)
        a = b & _U32(0x7FFFFFFF)
        nan = _U32(0x7C00) | ((a & _U32(0x7FFFFF)) >> _U32(13))
        nan = _U32(0x7C01) if nan == _U32(0x7C00) else nan
        return _U16(nan | ((b >> _U32(16)) & _U32(0x8000)))
    return _trunc16(v)


def load(a, i):
    """`a[i]` as float32: float16 bits (uint16) converted, float32 as it is."""


def put(a, i, v):
    """`a[i] = v` (float32, the result of arithmetic): rounded to float16 bits when `a` is
    uint16."""


@overload(load)
def _load(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _ext16(a[i])
    return lambda a, i: a[i]


@overload(put)
def _put(a, i, v):
    if a.dtype == types.uint16:
        def put16(a, i, v):
            a[i] = _trunc16(v)
        return put16

    def put32(a, i, v):
        a[i] = v
    return put32
