"""Optional compiled float16 <-> float32 converters (numba, the `fast` extra).

NumPy has no vectorised float16 conversion: its cast is a scalar loop and the NumPy converters
(`_f16_numpy`, `_util`) take a dozen array passes. With numba installed, these loops compile to
the CPU's own conversion instructions (x86 F16C, ARM FCVT): ~20x faster, with the same bits,
which the first use checks against the NumPy converters before enabling them (every rounding
case, subnormals, infinities and every NaN rule: NaN payloads are kept as NumPy keeps them).
Without numba, or with `POPXL_NUMBA=0`, or if the check fails, the NumPy converters run; results
do not depend on which.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional, Tuple

import numpy as np

__all__ = ["converters", "enabled"]

# The compiled loops live in `_f16_jit` (module level, so numba can cache them on disk); that
# module imports numba, and is imported only on the first float16 conversion.

_LOCK = threading.Lock()
_STATE: dict = {}


def enabled() -> bool:
    """Whether the compiled converters are in use (numba present, allowed and checked)."""
    return converters() is not None


def converters() -> Optional[Tuple[Callable, Callable]]:
    """`(f32_to_f16(x_f32, out_u16), f16_to_f32(h_u16, out_f32))` over 1-D contiguous arrays, or
    None where numba is absent, disabled (`POPXL_NUMBA=0`) or failed its check."""
    if os.environ.get("POPXL_NUMBA", "").strip() == "0":
        return None
    if "fns" not in _STATE:
        with _LOCK:
            if "fns" not in _STATE:
                _STATE["fns"] = _build()
    return _STATE["fns"]


def _build() -> Optional[Tuple[Callable, Callable]]:
    try:
        fns = _compile()
        if _check(*fns):
            return fns
    except Exception:  # noqa: BLE001 - any failure leaves the NumPy converters in charge
        pass
    return None


def _compile() -> Tuple[Callable, Callable]:
    from . import _f16_jit

    return _f16_jit.to16, _f16_jit.from16


def _check(to16: Callable, from16: Callable) -> bool:
    """The compiled converters against the NumPy ones on every float16 and on float32 values
    covering each rounding case of every exponent, overflow, infinities and NaNs."""
    from ._f16_numpy import _F16_TO_F32, _f32_bits_to_f16

    h = np.arange(2 ** 16, dtype=np.uint16)
    f = np.empty(h.size, np.float32)
    from16(h, f)
    if f.view(np.uint32).tobytes() != _F16_TO_F32.view(np.uint32).tobytes():
        return False
    low = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001, 0x3000, 0x7FFFFF,
                    0x400000, 0x3FFFFF, 0x402000, 0x401000], np.uint32)
    u = ((np.arange(256, dtype=np.uint32) << np.uint32(23))[:, None] | low[None, :]).ravel()
    rng = np.random.default_rng(0)
    u = np.concatenate([u, rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32)])
    u = np.concatenate([u, u | np.uint32(0x80000000)])
    want = np.empty(u.size, np.uint16)
    _f32_bits_to_f16(u, want)
    got = np.empty(u.size, np.uint16)
    to16(u.view(np.float32), got)
    return got.tobytes() == want.tobytes()
