"""Kernels: the float8 casts Pow2ScaleThenCast / CastThenPow2Scale, the scale search Fp8Scale,
and helpers for the pow2-scaled matmul and convolutions (float8 arrays are uint8 codes)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ... import _float8
from ...errors import DeviceRuntimeError
from ._util import np_dtype
from .registry import kernel

__all__ = ["runtime_scale", "checks_scale", "decoder", "pow2scaled"]


def runtime_scale(s: np.ndarray, op_type: str, check: bool = True) -> int:
    """The value of a log2_scale input. Outside [-32, 32): a DeviceRuntimeError (a Poplar
    runtime error upstream) when `check` (SessionOptions.throwIfLog2ScaleTensorNotInRange),
    else the value as it is (undefined upstream: here 2^value, as inside the range)."""
    v = int(s.reshape(()) if isinstance(s, np.ndarray) else s)
    lo, hi = _float8.LOG2_SCALE_RANGE
    if check and not lo <= v < hi:
        raise DeviceRuntimeError(f"{op_type}: log2_scale must lie in [{lo}, {hi}), got {v} "
                                 f"(SessionOptions.throwIfLog2ScaleTensorNotInRange)")
    return v


def checks_scale(env) -> bool:
    """Whether the Session checks log2 scales (its IR's SessionOptions when it was made; a
    kernel built without a compiler, `env` None, checks)."""
    return env is None or getattr(env.ir, "log2_scale_checks", True)


def decoder(info) -> Callable[[np.ndarray], np.ndarray]:
    """codes -> exact float32 values (a new array), for a float8 tensor's TensorInfo."""
    table = _float8.decode_table(_float8.format_of(info.dtype.name))
    return lambda codes: np.asarray(table[codes])


@kernel("Pow2ScaleThenCast", settings=True)
def _pow2scale_then_cast(attrs, ins, outs, env=None):
    fmt = _float8.format_of(outs[0].dtype.name)
    check = checks_scale(env)

    def run(x, s):
        return _float8.encode(x, fmt, runtime_scale(s, "Pow2ScaleThenCast", check), True)
    return run


@kernel("CastThenPow2Scale", settings=True)
def _cast_then_pow2scale(attrs, ins, outs, env=None):
    dec = decoder(ins[0])
    out = np_dtype(outs[0])
    check = checks_scale(env)

    def run(codes, s):
        v = dec(codes)
        k = runtime_scale(s, "CastThenPow2Scale", check)
        if k:
            v *= np.float32(2.0 ** k)        # exact: float8 values times 2^k stay normal
        return v.astype(out, copy=False)
    return run


def pow2scaled(fn: Callable, ins, outs, op_type: str, env) -> Callable:
    """Kernel for a float8 (a, b, log2_scale) op: `fn` on the exact float32 values of a and b,
    times 2^log2_scale in float32, rounded once to the output dtype."""
    check = checks_scale(env)
    dec_a, dec_b = decoder(ins[0]), decoder(ins[1])
    out = np_dtype(outs[0])

    def run(a, b, s):
        y = fn(dec_a(a), dec_b(b))
        k = runtime_scale(s, op_type, check)
        if k:
            # as ldexp: exact unless float32 underflow, far below the float16 output's range
            y *= np.float32(2.0 ** k)
        return y.astype(out)
    return run


# Fp8Scale: upstream's on-device search (popxl_addons' fp8_mse_scale C++ op), step for step in
# float32: a histogram of |src| over the 254 binades 2^-126 .. 2^127 (levels cast to src's
# dtype, so float16 data sees levels that underflow to 0 or overflow to inf; a bin holds
# [level_(i-1), level_i)), normalised by the element count; then for each of the 62 scaling
# biases b, summed in histogram order from index 1:
#   underflow   c <  u:      h_c * l_c * l_c
#   rounding    u <= c < o:  h_c * l_c * l_c * quantisation_error
#   overflow    c >= o:      h_c * (l_(o-1) - l_c)^2
# with u = min_fp32_exp_index + b, o = u + format_span, l_c = 2^(c-126). The first bias with the
# lowest cost, moved up by half the number of biases that tie with it, gives the scale
# -(bias + ties // 2 - 31).
_FP8_LEVELS = (2.0 ** np.arange(-126, 128)).astype(np.float32)
_FP8_BIASES = 62


@kernel("Fp8Scale")
def _fp8_scale(attrs, ins, outs):
    first = int(attrs["min_fp32_exp_index"])
    span = int(attrs["format_span"])
    qerr = np.float32(attrs["quantisation_error"])
    src_dtype = np_dtype(ins[0])
    with np.errstate(over="ignore", under="ignore"):
        levels = _FP8_LEVELS.astype(src_dtype)
    c = np.arange(1, _FP8_LEVELS.size)                        # histogram indices summed
    lim = _FP8_LEVELS[c]
    b = np.arange(_FP8_BIASES)[:, None]
    under, over = first + b, first + span + b
    sat = _FP8_LEVELS[over - 1]                               # (62, 1)

    def run(x):
        bins = np.searchsorted(levels, np.abs(x.reshape(-1)), side="right")
        hist = np.bincount(bins, minlength=levels.size + 1).astype(np.float32)
        hist = (hist / np.float32(x.size))[1:]
        h = hist[c]
        with np.errstate(over="ignore", invalid="ignore"):
            hl2 = h * lim * lim
            d = sat - lim
            terms = np.where(c < under, hl2, np.where(c < over, hl2 * qerr, h * d * d))
            mse = np.cumsum(terms.astype(np.float32), axis=1, dtype=np.float32)[:, -1]
        best = mse.min()
        ties = int(np.count_nonzero(mse == best))
        first_best = int(np.argmax(mse == best))
        return np.array(-(first_best + ties // 2 - 31), np.int32)
    return run
