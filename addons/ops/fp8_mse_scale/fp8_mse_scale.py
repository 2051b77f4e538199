"""`fp8_mse_scale`: the log2 scale that minimises the squared error of a float8 round trip.

Upstream implements this as a C++ custom op over a histogram of exponents. Here it is a popxl
`repeat` over the 63 candidate scales in [-31, 31]: each iteration casts `src * 2^s` (clipped
to the format's range, i.e. saturating) to float8 and back and measures
sum((q * 2^-s - src)^2) with NaN terms as 0, keeping the best scale (the smallest on ties).
The error is summed in float64: quantisation errors of different scales often differ only in
the 8th significant digit (relative rounding error does not depend on the scale), which
float32 cannot resolve. This is the computation of `popxl.fp8_utils.host_fp8_mse_scale`.
"""
from __future__ import annotations

import numpy as np

import popxl
from popxl import ops

from ..fp8_utils import fp8_def

__all__ = ["fp8_mse_scale"]

max_scaling_bias = 31
min_scaling_bias = -31


def fp8_mse_scale(src: popxl.Tensor, dtype: popxl.dtype = popxl.float8_143) -> popxl.Tensor:
    """The scale in [-31, 31] minimising the squared error of
    `pow2scale_cast_from_fp8(pow2scale_cast_to_fp8(src, s, dtype), -s)` against `src` with
    saturation instead of NaN on overflow; an int32 scalar tensor.

    Args:
        src: a float16 or float32 tensor.
        dtype: `popxl.float8_143` or `popxl.float8_152`.

    Returns:
        The int32 scalar scale.
    """
    fmt = fp8_def(dtype, "fp8_mse_scale")
    if not isinstance(src, popxl.Tensor) or src.dtype not in (popxl.float16, popxl.float32):
        raise TypeError(f"fp8_mse_scale: src must be a float16 or float32 tensor, got {src!r}")
    flat = ops.cast(src, popxl.float32).reshape((src.nelms,))
    flat64 = ops.cast(flat, popxl.float64)
    fmax = float(fmt.max_value)

    def candidate(s, best_s, best_err, x, x64):
        p = ops.pow(popxl.constant(2.0, popxl.float32, "two"), ops.cast(s, popxl.float32))
        xs = ops.clip(x * p, -fmax, fmax)          # exact: a power-of-two scale
        q = ops.pow2scale_cast_from_fp8(ops.pow2scale_cast_to_fp8(xs, 0, dtype), 0,
                                        popxl.float32)
        d = ops.cast(q, popxl.float64) / ops.cast(p, popxl.float64) - x64
        d = ops.where(ops.isnan(d), popxl.constant(0.0, popxl.float64, "zero"), d)
        err = ops.sum(d * d)
        better = ops.greater(best_err, err)
        one = popxl.constant(np.int32(1), popxl.int32, "one")
        return s + one, ops.where(better, s, best_s), ops.where(better, err, best_err)

    ir = popxl.gcg().ir
    graph = ir.create_graph(candidate, popxl.TensorSpec((), popxl.int32),
                            popxl.TensorSpec((), popxl.int32),
                            popxl.TensorSpec((), popxl.float64), flat, flat64)
    lo = popxl.constant(np.int32(min_scaling_bias), popxl.int32, "min_scaling_bias")
    worst = popxl.constant(np.inf, popxl.float64, "inf")
    n = max_scaling_bias - min_scaling_bias + 1
    _, best, _ = ops.repeat(graph, n, lo, lo, worst, flat, flat64)
    return best
