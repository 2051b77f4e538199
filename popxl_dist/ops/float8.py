"""Builders: the float8 casts `pow2scale_cast_to_fp8` and `pow2scale_cast_from_fp8`.

float8 tensors hold uint8 codes (formats, rounding and overflow: `popxl_dist._float8`). The
`log2_scale` of every pow2-scaled op is an int32 scalar Tensor read at run time; a value outside
[-32, 32) raises when the op runs.
"""
from __future__ import annotations

import numpy as np

from .. import _float8, dtypes
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_tensor

__all__ = ["pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8"]


def log2_scale_tensor(opname: str, log2_scale) -> Tensor:
    """`log2_scale` as an int32 scalar Tensor (a Python int becomes a constant)."""
    if isinstance(log2_scale, Tensor):
        if log2_scale.dtype != dtypes.int32 or log2_scale.nelms != 1:
            raise TypeError(f"{opname}: 'log2_scale' '{log2_scale.id}' must be an int32 scalar, "
                            f"got {log2_scale.dtype.name} {log2_scale.shape}")
        return log2_scale
    s = _float8.check_log2_scale(log2_scale, opname)
    return constant(np.int32(s), dtypes.int32, "log2_scale")


def check_float8(opname: str, t: Tensor, argname: str) -> None:
    check_tensor(t, opname, argname)
    if t.dtype not in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"{opname}: '{argname}' '{t.id}' must be float8_143 or float8_152, got "
                        f"{t.dtype.name}")


def pow2scale_cast_to_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """`cast(t * 2^log2_scale, data_type)`: float16/float32 to float8, fused.

    Rounds to nearest even; values whose magnitude rounds above the format's largest (and
    +-inf) become NaN, as `host_pow2scale_cast_to_fp8(..., nan_on_overflow=True)`.

    Args:
        t: a float16 or float32 tensor.
        log2_scale: an int32 scalar tensor (a Python int is accepted and made a constant).
        data_type: `popxl.float8_143` or `popxl.float8_152`.

    Returns:
        The float8 tensor.
    """
    name = "pow2scale_cast_to_fp8"
    check_tensor(t, name, "t")
    if t.dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{name}: 't' '{t.id}' must be float16 or float32, got {t.dtype.name}")
    d = dtypes.dtype.as_dtype(data_type)
    if d not in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"{name}: data_type must be popxl.float8_143 or popxl.float8_152, got "
                        f"{d!r}")
    s = log2_scale_tensor(name, log2_scale)
    return add_op("Pow2ScaleThenCast", name, [t, s],
                  [Out(f"{name}_out", t.shape, d, t.meta_shape)], {"to": d.name})[0]


def pow2scale_cast_from_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """`cast(t, data_type) * 2^log2_scale`: float8 to float16/float32, fused (NaN stays NaN).

    Args:
        t: a float8 tensor.
        log2_scale: an int32 scalar tensor (a Python int is accepted and made a constant).
        data_type: `popxl.float16` or `popxl.float32`.

    Returns:
        The float16/float32 tensor.
    """
    name = "pow2scale_cast_from_fp8"
    check_float8(name, t, "t")
    d = dtypes.dtype.as_dtype(data_type)
    if d not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{name}: data_type must be popxl.float16 or popxl.float32, got {d!r}")
    s = log2_scale_tensor(name, log2_scale)
    return add_op("CastThenPow2Scale", name, [t, s],
                  [Out(f"{name}_out", t.shape, d, t.meta_shape)],
                  {"from": t.dtype.name, "to": d.name})[0]
