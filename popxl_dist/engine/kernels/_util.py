"""Helpers shared by kernel families: IPU-like float16 numerics and scalar coercion."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Iterator, Optional

import numpy as np

from ...dtypes import storage_numpy
from ._f16_numpy import _F16_TO_F32, _f32_bits_to_f16

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)

# --- fast float16 conversions ----------------------------------------------------------------
# NumPy's float->float16 cast flags an underflow for every inexact result in float16's subnormal
# range (|x| < 2**-14), which makes casting small values (gradients, optimiser moments) ~20x
# slower than casting others, and its float16->float32 cast normalises subnormals one bit at a
# time. `to_f16` / `from_f16` give the same bits (NaN payloads included) without those paths:
# float32 -> float16 with integer arithmetic, float16 -> float32 by table lookup.
_U32 = np.uint32


def from_f16(h: np.ndarray) -> np.ndarray:
    """A float16 array as float32 (bit for bit `h.astype(float32)`): compiled when numba is
    installed (see `_f16_numba`), else by table lookup."""
    h = np.asarray(h)
    return f16_into(h, np.empty(h.shape, np.float32))


def f16_into(h: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`h` (float16) converted into `out` (float32, C-contiguous, h's shape); returns out."""
    conv = _converters()
    if conv is not None and out.flags.c_contiguous:
        if h.ndim == 1 and out.ndim == 1 and h.flags.c_contiguous:      # no reshapes needed
            conv[1](h.view(np.uint16), out)
        else:
            conv[1](np.ascontiguousarray(h).reshape(-1).view(np.uint16), out.reshape(-1))
    else:
        np.take(_F16_TO_F32, h.view(np.uint16), out=out)
    return out


def _converters():
    """The compiled float16 converters, or None (NumPy's then)."""
    conv = _CONV.get("fns", _UNSET)
    if conv is _UNSET:
        from ._f16_numba import converters

        conv = _CONV["fns"] = converters()
    return conv


_CONV: dict = {}
_UNSET = object()


def jit_loops():
    """The compiled element-wise loops (`_jit_ew`) where the compiled converters are in use
    (numba installed, allowed and checked) and floating-point events do not raise (see
    `fp_events`), else None: kernels then run their NumPy passes."""
    if getattr(_TLS, "checks", False):
        return None
    loops = _CONV.get("loops", _UNSET)
    if loops is _UNSET:
        loops = None
        if _converters() is not None:
            from . import _jit_ew as loops
        _CONV["loops"] = loops
    return loops


_TLS = threading.local()


def fp_checks_on() -> bool:
    """Whether floating-point events raise in this thread (see `fp_events`)."""
    return getattr(_TLS, "checks", False)


@contextlib.contextmanager
def fp_events(events: Dict[str, str]) -> Iterator[None]:
    """`np.errstate(**events)` for the kernels run inside, in this thread. Where an event raises
    (SessionOptions.enableFloatingPointChecks), the compiled loops, which cannot raise, stand
    aside: NumPy's passes run and raise, naming the op."""
    prev = getattr(_TLS, "checks", False)
    _TLS.checks = "raise" in events.values()
    try:
        with np.errstate(**events):
            yield
    finally:
        _TLS.checks = prev


def use_compiled_converters(flag: Optional[bool]) -> None:
    """Force the NumPy converters and loops (False), or re-detect the compiled ones (None):
    for tests."""
    _CONV.clear()
    if flag is False:
        _CONV["fns"] = None


_CHUNK = 65536        # elements converted at a time: the ~20 passes then run in cache


def _f32_to_f16(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """float32 -> float16, round half to even, as IEEE and NumPy do (into `out`, a C-contiguous
    float16 array of x's shape, when given)."""
    if out is None:
        out = np.empty(np.shape(x), np.float16)
    conv = _converters()
    if conv is not None and x.ndim == 1 and out.ndim == 1 and x.flags.c_contiguous:
        conv[0](x, out.view(np.uint16))             # no reshapes needed
        return out
    x = np.ascontiguousarray(x)
    bits = out.reshape(-1).view(np.uint16)
    if conv is not None:
        conv[0](x.reshape(-1), bits)
        return out
    u = x.view(_U32).reshape(-1)
    for i in range(0, u.size, _CHUNK):
        _f32_chunk_to_f16(u[i:i + _CHUNK], bits[i:i + _CHUNK])
    return out


_BIG = _U32(0x47800000)             # |x| >= 2**16 (or inf / NaN): the general path below


def _f32_chunk_to_f16(u: np.ndarray, out: np.ndarray) -> None:
    """float32 bits -> float16 bits (`out`, uint16) in a dozen cheap passes, in scratch memory.

    The float unit rounds: |x| + m with m = 2**(max(e, -14) + 13) (e: |x|'s exponent) has the
    ulp of x in float16 (2**-24 in float16's subnormal range), so (|x| + m) - m is |x| rounded
    half to even to float16, exactly. Times 2**-112 (exact) its float32 bits shifted right by 13
    are the float16 bits; a result of 2**16 gives the infinity bits. The sign bit is x's bit 31
    moved to bit 15. Larger magnitudes, infinities and NaNs take `_f32_bits_to_f16`."""
    n = u.size
    a = scratch("f16_abs", n, np.float32)
    np.abs(u.view(np.float32), out=a)
    ab = a.view(_U32)
    if n and ab.max() >= _BIG:
        _f32_bits_to_f16(u, out)
        return
    m = scratch("f16_magic", n, _U32)
    np.bitwise_and(ab, _U32(0x7F800000), out=m)
    np.maximum(m, _U32(113 << 23), out=m)
    m += _U32(13 << 23)
    mf = m.view(np.float32)
    a += mf
    a -= mf
    a *= np.float32(2.0 ** -112)
    np.right_shift(ab, _U32(13), out=m)
    s = scratch("f16_sign", n, _U32)
    np.right_shift(u, _U32(16), out=s)
    np.bitwise_and(s, _U32(0x8000), out=s)
    np.bitwise_or(m, s, out=m)
    np.copyto(out, m, casting="unsafe")


def round_f16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to float16's (bit for bit `x.astype(float16).astype(float32)`),
    computed in float32 without the two conversions."""
    conv = _converters()
    if conv is not None:               # two compiled passes (the definition) beat a dozen NumPy ones
        x32 = np.ascontiguousarray(x, np.float32).reshape(-1)
        out = np.empty(x32.size, np.float32)
        bits = scratch("round_f16", x32.size, np.uint16)
        conv[0](x32, bits)
        conv[1](bits, out)
        return out.reshape(np.shape(x))
    u = np.ascontiguousarray(x, np.float32).view(_U32).reshape(-1)
    out = np.empty(u.size, _U32)
    for i in range(0, u.size, _CHUNK):
        _round_bits_f16(u[i:i + _CHUNK], out[i:i + _CHUNK])
    return out.view(np.float32).reshape(np.shape(x))


def _round_bits_f16(u: np.ndarray, out: np.ndarray) -> None:
    a = u & _U32(0x7FFFFFFF)
    if (a >= _U32(0x477FF000)).any():            # rounds to inf, or is inf / NaN (rare)
        out[...] = from_f16(to_f16(u.view(np.float32))).view(_U32)
        return
    r = (a >> _U32(13)) & _U32(1)                # keep 10 mantissa bits, half to even
    r += a
    r += _U32(0xFFF)
    r &= _U32(0xFFFFE000)
    sub = a < _U32(0x38800000)                   # |x| < 2**-14: onto the 2**-24 grid
    if sub.any():
        s = a.view(np.float32) + np.float32(0.5)
        s -= np.float32(0.5)
        d = s.view(_U32) - r
        d *= sub
        r += d
    r |= u & _U32(0x80000000)
    out[...] = r


def to_f16(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """A float array rounded to float16 (bit for bit `x.astype(float16)`), into `out` (a
    C-contiguous float16 array of x's shape) when given."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return _f32_to_f16(x, out)
    if out is not None:
        out[...] = to_f16(x)
        return out
    if x.dtype == np.float64:
        small = np.abs(x) < 2.0 ** -14
        if small.any():        # round to the subnormal grid (2**-24) first: the cast is exact
            c = np.copysign(2.0 ** 28, x)
            with np.errstate(invalid="ignore"):
                x = np.where(small, np.copysign((x + c) - c, x), x)
    return x.astype(np.float16)


def blocks(n: int, chunked: bool = True):
    """`(lo, hi)` ranges covering n elements: `_CHUNK`-sized when `chunked` (float16 kernels
    run their conversions and arithmetic block by block, in cache), else one range."""
    if not chunked or 0 < n <= _CHUNK:
        return ((0, n),)
    return ((i, min(i + _CHUNK, n)) for i in range(0, n, _CHUNK))


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array (writes reach `a`)."""
    return a.reshape(-1)


def same_start(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a and b begin at the same address (an output on an input's own buffer). The
    bounds test first: `.ctypes.data` costs about 1.5 us an array, paid only on overlap."""
    return np.may_share_memory(a, b) and a.ctypes.data == b.ctypes.data


def jit_view(a: np.ndarray) -> np.ndarray:
    """A float16 / float32 array as the compiled loops take it: float16 as its uint16 bits."""
    return a.view(np.uint16) if a.dtype == F16 else a


def cast(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """`x.astype(dt)` (a new array), through the fast paths for float16."""
    if dt == F16 and x.dtype != F16 and x.dtype.kind == "f":
        return to_f16(x)
    if x.dtype == F16 and dt == F32:
        return from_f16(x)
    return x.astype(dt)


def as_dtype(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """`x.astype(dt, copy=False)` through the fast float16 converters (the same bits)."""
    return x if x.dtype == dt else cast(x, dt)


def cast_into(x: np.ndarray, dt: np.dtype, out: Optional[np.ndarray]) -> np.ndarray:
    """`cast(x, dt)`, written into `out` when given (same bits)."""
    if out is None:
        return cast(x, dt)
    if dt == F16 and x.dtype == F32:
        return to_f16(x, out)
    if x.dtype == F16 and dt == F32:
        f16_into(x, out)
    elif dt == F16 and x.dtype != F16 and x.dtype.kind == "f":
        out[...] = to_f16(x)
    else:
        np.copyto(out, x, casting="unsafe")
    return out


def np_dtype(info) -> np.dtype:
    """The NumPy dtype of a tensor's arrays (uint8 codes for float8)."""
    return storage_numpy(info.dtype)


def via_f32(fn: Callable, out_dtype: np.dtype) -> Callable:
    """Run `fn` in float32 and round once to float16 (the IPU's float16 arithmetic);
    other dtypes run `fn` as it is. The float16 wrapper accepts `out=` (see `writes_out`)."""
    if out_dtype != F16:
        return fn

    def wrapped(*arrays, out=None):
        res = fn(*[from_f16(a) if a.dtype == F16 else a for a in arrays])
        return to_f16(res, out)

    return wrapped


def without_out(fn: Callable) -> Callable:
    """Mark a callable of a `writes_out` kernel that does not accept `out=` (a dtype case the
    kernel leaves to NumPy): the compiler then treats it like any kernel without the flag."""

    def run(*arrays):
        return fn(*arrays)

    run.no_out = True
    return run


def ufunc_out(ufunc, ins, outs) -> Callable:
    """A NumPy ufunc as a `writes_out` callable when every operand has the output's dtype
    (the result is then the same with or without `out=`), else the ufunc without `out=`."""
    dt = storage_numpy(outs[0].dtype)
    if all(storage_numpy(i.dtype) == dt for i in ins):
        return ufunc
    return without_out(ufunc)


_SCRATCH = threading.local()
_DTYPES = {np.float32: F32, F32: F32}      # dtype argument -> np.dtype, without np.dtype()'s cost


def scratch(tag: str, n: int, dtype=F32) -> np.ndarray:
    """A reusable 1-D work array of at least `n` elements of `dtype` for this thread (fused
    kernels' temporaries: allocated once, grown when a larger one is asked for, and shared by
    every kernel using the same tag; one kernel never uses a tag twice at once). Called tens of
    thousands of times a step on small models: kept to a few dictionary lookups."""
    try:
        pool = _SCRATCH.pool
    except AttributeError:
        pool = _SCRATCH.pool = {}
    dt = _DTYPES.get(dtype)
    if dt is None:
        dt = _DTYPES[dtype] = np.dtype(dtype)
    key = (tag, dt)
    a = pool.get(key)
    if a is None or a.size < n:
        a = pool[key] = np.empty(max(n, 1), dt)
    return a if a.size == n else a[:n]


def scalar(x, dtype=np.float32):
    """A Python number or 0-d/1-element array as a NumPy scalar of `dtype`."""
    return np.asarray(x, dtype=dtype).reshape(())[()]
