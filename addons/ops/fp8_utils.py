"""The float8 format tables of popxl_addons' fp8 ops (upstream's `ops/fp8_utils.py`)."""
from __future__ import annotations

from collections import namedtuple

import popxl

__all__ = ["FpDef", "ieee_fp32_no_denorms", "ieee_fp16_denorms", "float8_152_def",
           "float8_143_def", "fp8_def"]

# A floating point format: widths, exponent bias, whether subnormals count, whether the top
# exponent code is Inf/NaN, the largest value and the largest / smallest exponent.
FpDef = namedtuple("FpDef", ["num_exp_bits", "num_mantissa_bits", "fix_exponent_bias",
                             "include_denorm", "has_nans", "max_value", "max_exp", "min_exp"])
ieee_fp32_no_denorms = FpDef(8, 23, 127, False, True, 3.4028235e38, 127, -126)
ieee_fp16_denorms = FpDef(5, 10, 15, True, True, 65504, 15, -14)
float8_152_def = FpDef(5, 2, 16, True, False, 57344, 15, -17)
float8_143_def = FpDef(4, 3, 8, True, False, 240, 7, -10)


def fp8_def(dtype: popxl.dtype, what: str) -> FpDef:
    """The table of a popxl float8 dtype; TypeError naming `what` for any other dtype."""
    if dtype == popxl.float8_143:
        return float8_143_def
    if dtype == popxl.float8_152:
        return float8_152_def
    raise TypeError(f"{what}: dtype must be popxl.float8_143 or popxl.float8_152, got {dtype!r}")
