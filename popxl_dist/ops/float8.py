"""Builders: the float8 casts `pow2scale_cast_to_fp8` and `pow2scale_cast_from_fp8`, and
`fp8_scale` (op `Fp8Scale`, upstream a popxl.addons C++ op: `popxl_addons.ops.fp8_mse_scale`).

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
    """`log2_scale` as an int32 scalar Tensor, checked as upstream (ValueError for a tensor that
    is not a scalar, TypeError for another dtype). popxl-dist extension: a Python int becomes
    a constant (upstream needs a Tensor)."""
    if isinstance(log2_scale, Tensor):
        if log2_scale.rank > 0:
            raise ValueError(f"Log2 scale argument must be a scalar tensor ({opname}: "
                             f"'{log2_scale.id}' has shape {log2_scale.shape})")
        if log2_scale.dtype != dtypes.int32:
            raise TypeError(f"Log2 scale tensor must be of type popxl.int32 ({opname}: "
                            f"'{log2_scale.id}' is {log2_scale.dtype.name})")
        return log2_scale
    s = _float8.check_log2_scale(log2_scale, opname)
    return constant(np.int32(s), dtypes.int32, "log2_scale")


def check_float8_operands(opname: str, what: str, **tensors: Tensor) -> None:
    """Upstream's check of the pow2-scaled matmul / conv operands (`what`: "matmul" or
    "conv"): each must be a float8 Tensor."""
    for argname, t in tensors.items():
        check_tensor(t, opname, argname)
    bad = [f"'{t.id}' {t.dtype.name}" for t in tensors.values()
           if t.dtype not in dtypes.FLOAT8_DTYPES]
    if bad:
        raise TypeError(f"Scaled {what} operands must be of dtype popxl.float8_143 or "
                        f"popxl.float8_152 ({opname}: got {', '.join(bad)})")


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
    if data_type not in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"Data type {data_type} not supported for popxl.ops.cast "
                        f"({name} casts to popxl.float8_143 or popxl.float8_152)")
    s = log2_scale_tensor(name, log2_scale)
    check_tensor(t, name, "t")
    if t.dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{name}: 't' '{t.id}' must be float16 or float32, got {t.dtype.name}")
    return add_op("Pow2ScaleThenCast", name, [t, s],
                  [Out(f"{t.name}_{data_type.name}", t.shape, data_type, t.meta_shape)],
                  {"to": data_type.name})[0]


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
    if data_type not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"Data type {data_type} not supported for popxl.ops.cast "
                        f"({name} casts to popxl.float16 or popxl.float32)")
    s = log2_scale_tensor(name, log2_scale)
    check_float8(name, t, "t")
    return add_op("CastThenPow2Scale", name, [t, s],
                  [Out(f"{t.name}_{data_type.name}", t.shape, data_type, t.meta_shape)],
                  {"from": t.dtype.name, "to": data_type.name})[0]


def fp8_scale(src: Tensor, min_fp32_exp_index: int, format_span: int,
              quantisation_error: float) -> Tensor:
    """The log2 scale for casting `src` to a float8 format with the least estimated squared
    error, as an int32 scalar (op `Fp8Scale`, domain `popxl.addons.ops`; no gradient).

    The estimate is upstream's on-device one (see `engine/kernels/float8.py`): a histogram of
    `|src|` over the binades 2^-126 .. 2^127, then for each of 62 scaling biases the underflow,
    rounding and overflow costs of the `format_span` binades starting at histogram index
    `min_fp32_exp_index + bias`.

    Args:
        src: a 1-D float16 or float32 tensor.
        min_fp32_exp_index, format_span, quantisation_error: the destination format's
            parameters (`popxl_addons.ops.fp8_mse_scale.CandidateConfig`).
    """
    name = "fp8_scale"
    check_tensor(src, name, "src")
    if src.dtype not in (dtypes.float16, dtypes.float32) or src.rank != 1:
        raise TypeError(f"{name}: 'src' must be a 1-D float16 or float32 tensor, got "
                        f"'{src.id}' {src.dtype.name} {src.shape}")
    for arg, v in (("min_fp32_exp_index", min_fp32_exp_index), ("format_span", format_span)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: {arg} must be a non-negative int, got {v!r}")
    if min_fp32_exp_index + format_span + 61 >= 254:
        raise ValueError(f"{name}: min_fp32_exp_index + format_span = "
                         f"{min_fp32_exp_index + format_span} leaves no room for the 62 scaling "
                         f"biases in the 254 binades of the histogram")
    attrs = {"min_fp32_exp_index": int(min_fp32_exp_index), "format_span": int(format_span),
             "quantisation_error": float(np.float32(quantisation_error))}
    return add_op("Fp8Scale", name, [src], [Out("scaling_bias", (), dtypes.int32)], attrs)[0]
