"""`fp8_mse_scale`: the log2 scale for a float8 cast with the least estimated squared error,
computed on the device (upstream: a popxl.addons C++ custom op, `Fp8Scale`).

The estimate is upstream's: a histogram of the binary exponents of `|src|`, and for each of 62
scaling biases the cost of the values that would underflow, be rounded, or overflow (see
`popxl.ops.float8.fp8_scale`). `CandidateConfig` gives the destination format's parameters.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import popxl
from popxl import float8_143, float8_152
from popxl.ops.float8 import fp8_scale

from ..fp8_utils import FpDef, float8_143_def, float8_152_def, ieee_fp16_denorms, \
    ieee_fp32_no_denorms

__all__ = ["fp8_mse_scale"]

max_scaling_bias = 31
min_scaling_bias = -31


class CandidateConfig:
    """The parameters of a destination float8 format for the scale search.

    Attributes:
        format: the popxl float8 dtype.
        num_exp_bits, num_mantissa_bits, fix_exponent_bias: of the destination format.
        quantisation_error: the relative squared rounding error `2^(-2 (m_src - m_dest))`, with
            `m_src` 23 when `src_type` equals `np.float32` and 10 otherwise (upstream passes the
            popxl dtype of the tensor, which never equals `np.float32`, so the on-device search
            always uses 10).
        format_span: how many binades the destination covers.
        min_src_exp, max_src_exp: the histogram indices (binades of float32, from 2^-126) where
            the destination's range starts at the smallest / largest scaling bias;
            `num_exp_src` of them.
    """

    def __init__(self, format: Any, src_ftype: FpDef, dest_ftype: FpDef,  # noqa: A002
                 src_type: Any) -> None:
        self.format = format
        self.num_exp_bits = dest_ftype.num_exp_bits
        self.num_mantissa_bits = dest_ftype.num_mantissa_bits
        self.fix_exponent_bias = dest_ftype.fix_exponent_bias
        src_mantissa = (ieee_fp32_no_denorms.num_mantissa_bits if src_type == np.float32
                        else ieee_fp16_denorms.num_mantissa_bits)
        self.quantisation_error = 2 ** (-2.0 * (src_mantissa - self.num_mantissa_bits))
        self.format_span = dest_ftype.max_exp - dest_ftype.min_exp + 1
        self.min_src_exp = dest_ftype.min_exp + min_scaling_bias - src_ftype.min_exp
        self.max_src_exp = min(dest_ftype.min_exp + max_scaling_bias - src_ftype.min_exp,
                               src_ftype.max_exp - src_ftype.min_exp)
        self.num_exp_src = self.max_src_exp - self.min_src_exp + 1


def fp8_mse_scale(src: popxl.Tensor, dtype: Any = float8_143) -> popxl.Tensor:
    """The log2 scale for `ops.pow2scale_cast_to_fp8(src, scale, dtype)` with the least
    estimated squared error, as an int32 scalar tensor in [-30, 31].

    Args:
        src: a float16 or float32 tensor (flattened).
        dtype: `popxl.float8_143` or `popxl.float8_152`.

    Raises:
        RuntimeError: `src` is not float16 or float32 (as upstream).
        TypeError: `dtype` is not a float8 dtype.

    Returns:
        The int32 scalar scale.
    """
    if not isinstance(src, popxl.Tensor):
        raise TypeError(f"fp8_mse_scale: src must be a popxl.Tensor, got {type(src).__name__}")
    src = src.flatten()
    if src.dtype not in (popxl.float32, popxl.float16):
        raise RuntimeError(f"dtype {src.dtype} not currently supported.")
    if dtype is float8_143:
        dest = float8_143_def
    elif dtype is float8_152:
        dest = float8_152_def
    else:
        raise TypeError(f"fp8_mse_scale: dtype must be popxl.float8_143 or popxl.float8_152, "
                        f"got {dtype!r}")
    candidate = CandidateConfig(dtype, ieee_fp32_no_denorms, dest, src.dtype)
    return fp8_scale(src, candidate.min_src_exp, candidate.format_span,
                     candidate.quantisation_error)
