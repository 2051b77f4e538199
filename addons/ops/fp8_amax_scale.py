"""`fp8_amax_scale`: the log2 scale that maps a tensor's largest magnitude into a float8
format's range."""
from __future__ import annotations

import numpy as np

import popxl
from popxl import ops

from .fp8_utils import fp8_def

__all__ = ["fp8_amax_scale"]


def fp8_amax_scale(src: popxl.Tensor, dtype: popxl.dtype = popxl.float8_143) -> popxl.Tensor:
    """`clip(floor(log2(fmt_max / max|src|)), -31, 31)` as an int32 scalar tensor: the largest
    scale for `ops.pow2scale_cast_to_fp8(src, scale, dtype)` that cannot overflow (31 for an
    all-zero `src`).

    Args:
        src: a float16 or float32 tensor.
        dtype: `popxl.float8_143` (largest 240) or `popxl.float8_152` (57344).

    Returns:
        The int32 scalar scale.
    """
    fmt = fp8_def(dtype, "fp8_amax_scale")
    if not isinstance(src, popxl.Tensor) or src.dtype not in (popxl.float16, popxl.float32):
        raise TypeError(f"fp8_amax_scale: src must be a float16 or float32 tensor, got {src!r}")
    amax = ops.cast(ops.max(ops.abs(src)), popxl.float32)
    # amax below fmt_max * 2^-40 (all zeros too) gives a scale above 31, clipped to 31:
    # clamping it there avoids dividing by zero or overflowing
    floor_ = np.float32(np.ldexp(fmt.max_value, -40))
    amax = ops.maximum(amax, popxl.constant(floor_, popxl.float32, "amax_floor"))
    ratio = ops.div(popxl.constant(fmt.max_value, popxl.float32, "fp8_max"), amax)
    scale = ops.clip(ops.floor(ops.log2(ratio)), -31.0, 31.0)
    return ops.cast(scale, popxl.int32)
