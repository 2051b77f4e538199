"""Host-side float8 helpers: pow2-scaled casts to and from float8 codes, and the MSE scale.

float8 data lives on the host as uint8 codes (one byte per value, upstream's representation;
see `popxl_dist._float8` for the bit formats, rounding and overflow). Arrays of the structured
dtypes `popxl.dtypes.np_dtype_float8_143/152` are accepted wherever codes are, and read as uint8.

Not provided: upstream's histogram machinery behind its MSE search (`find_exponential_range`,
`log_histogram`, `CandidateConfig`, `calculate_metric_mse`, `calculate_candidate_metric`,
`host_fp8_mse_scale_pb`); `host_fp8_mse_scale` here measures the error exactly instead.
"""
from __future__ import annotations

import importlib.util
from collections import namedtuple
from typing import Any, Optional

import numpy as np

from . import _float8, dtypes
from .dtypes import float8_143, float8_152

__all__ = ["host_pow2scale_cast_to_fp8", "host_pow2scale_cast_from_fp8", "host_fp8_mse_scale"]

# upstream: whether torch tensors can be passed (found without importing torch, which is slow)
torch_imported = importlib.util.find_spec("torch") is not None

max_scaling_bias = _float8.MSE_SCALE_RANGE[1]
min_scaling_bias = _float8.MSE_SCALE_RANGE[0]

# Field names beyond the first two are ours (upstream's list is not in the references).
FpDef = namedtuple("FpDef", ["num_exp_bits", "num_mantissa_bits", "fix_exponent_bias",
                             "include_denorm", "inf_and_nan"])
ieee_fp32_no_denorms = FpDef(8, 23, 127, False, True)
ieee_fp16_denorms = FpDef(5, 10, 15, True, True)
float8_152_def = FpDef(5, 2, 16, True, False)
float8_143_def = FpDef(4, 3, 8, True, False)

_BY_NP = {dtypes.np_dtype_float8_143: float8_143, dtypes.np_dtype_float8_152: float8_152}


def _convert_popxl_float8_dtype_to_numpy(np_dtype: Any) -> np.dtype:
    """The NumPy dtype float8 data is held in (uint8) for a float8 structured dtype; other
    dtypes unchanged."""
    npd = np.dtype(np_dtype)
    return np.dtype(np.uint8) if npd in _BY_NP else npd


def _float8_dtype(dtype: Any, what: str) -> dtypes.dtype:
    d = float8_143 if dtype is None else dtypes.dtype.as_dtype(dtype)
    if d not in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"{what}: dtype must be popxl.float8_143 or popxl.float8_152, got {d!r}")
    return d


def _as_array(src: Any, what: str) -> np.ndarray:
    if type(src).__module__.startswith("torch"):
        src = src.detach().cpu().numpy()
    try:
        return np.asarray(src)
    except Exception as e:  # noqa: BLE001 - re-raised naming the function
        raise TypeError(f"{what}: cannot convert {type(src).__name__} to a NumPy array") from e


def host_pow2scale_cast_to_fp8(src: Any, dtype: Optional[dtypes.dtype] = None,
                               log2_scale: int = 0, nan_on_overflow: bool = True) -> np.ndarray:
    """`cast(src * 2^log2_scale, dtype)` on the host, as float8 codes.

    Rounds to nearest, ties to even. Values whose magnitude rounds above the format's largest
    (240 for float8_143, 57344 for float8_152), and +-inf, become NaN (0x80) with
    `nan_on_overflow`, else +-largest. NaN becomes NaN; -0 becomes +0.

    Args:
        src: real-valued host data (NumPy, Python numbers or sequences, torch tensors).
        dtype: `popxl.float8_143` (default) or `popxl.float8_152`.
        log2_scale: an integer in [-32, 32).
        nan_on_overflow: NaN (True) or saturate (False) on overflow.

    Returns:
        A uint8 array of codes with the shape of `src`.

    Example:
        >>> host_pow2scale_cast_to_fp8(np.array([1.0, 250.0]), popxl.float8_143)
        array([ 64, 128], dtype=uint8)
    """
    what = "host_pow2scale_cast_to_fp8"
    d = _float8_dtype(dtype, what)
    s = _float8.check_log2_scale(log2_scale, what)
    arr = _as_array(src, what)
    if arr.dtype in _BY_NP or arr.dtype.kind not in "biuf":
        raise TypeError(f"{what}: src must hold real numbers, got dtype {arr.dtype} (float8 "
                        f"data is already cast)")
    return _float8.encode(arr, _float8.format_of(d.name), s, bool(nan_on_overflow))


def _codes(src: Any, dtype: Optional[dtypes.dtype], what: str):
    """(uint8 codes, float8 dtype) of float8 host data given as uint8 or structured arrays."""
    arr = _as_array(src, what)
    inferred = _BY_NP.get(arr.dtype)
    if inferred is not None:
        arr = arr.view(np.uint8).reshape(arr.shape)
        if dtype is not None and _float8_dtype(dtype, what) is not inferred:
            raise ValueError(f"{what}: src holds {inferred.name} data but dtype is {dtype!r}")
        return arr, inferred
    if arr.dtype != np.uint8:
        raise TypeError(f"{what}: src must be float8 codes (uint8, or a float8 structured "
                        f"dtype), got dtype {arr.dtype}")
    return arr, _float8_dtype(dtype, what)


def host_pow2scale_cast_from_fp8(src: Any, dtype: Optional[dtypes.dtype] = None,
                                 log2_scale: int = 0) -> np.ndarray:
    """`cast(src, float32) * 2^log2_scale` on the host, for float8 codes.

    Args:
        src: float8 codes: uint8, or an array of a float8 structured dtype.
        dtype: the float8 format of `src`; None means the structured dtype's, or float8_143.
        log2_scale: an integer in [-32, 32).

    Returns:
        float32 values with the shape of `src` (0x80 gives NaN).
    """
    what = "host_pow2scale_cast_from_fp8"
    s = _float8.check_log2_scale(log2_scale, what)
    codes, d = _codes(src, dtype, what)
    return np.ldexp(_float8.decode(codes, _float8.format_of(d.name)), s).astype(np.float32)


def host_fp8_mse_scale(src: Any, dtype: Optional[dtypes.dtype] = None) -> int:
    """The log2 scale in [-31, 31] for `host_pow2scale_cast_to_fp8(src, dtype, scale)` that
    minimises the mean squared error of `src` against its float8 round trip (overflow
    saturating). Ties go to the smallest scale; NaNs are ignored.

    Deviation: upstream estimates the error from a histogram of `src`'s exponents; here it is
    measured exactly for every candidate scale.
    """
    what = "host_fp8_mse_scale"
    d = _float8_dtype(dtype, what)
    arr = _as_array(src, what)
    if arr.dtype.kind not in "biuf" or arr.dtype in _BY_NP:
        raise TypeError(f"{what}: src must hold real numbers, got dtype {arr.dtype}")
    return _float8.mse_scale(arr, _float8.format_of(d.name))
