"""Host-side float8 helpers: pow2-scaled casts to and from float8, and the MSE scale search.

float8 data on the host is an array of the structured dtypes
`popxl.dtypes.np_dtype_float8_143` / `np_dtype_float8_152` (one `u1` field holding the code, as
upstream): `host_pow2scale_cast_to_fp8` returns one, `host_pow2scale_cast_from_fp8` reads one
(the structured dtype says which format the codes are in), and sessions hand them out for
float8 variables and streams. `arr.view(np.uint8)` gives the raw codes; `codes.view(
np_dtype_float8_143)` makes float8 data of uint8 codes. Bit formats, rounding and overflow:
`popxl_dist._float8`.

The MSE scale search has two forms, as upstream:

* `host_fp8_mse_scale(src, dtype)` -> `(mse, scale)`: a histogram of the exponents of `src`,
  an estimate of the mean squared error of each candidate scale from it
  (`calculate_candidate_metric`), and the middle one of the scales with the lowest estimate.
* `host_fp8_mse_scale_pb(src, dtype)` -> `scale`: upstream calls Poplar's
  `calculateMetadataForConversion`; the same estimate here, taking the first (smallest) of the
  scales with the lowest estimate, which is how upstream describes Poplar's choice.
"""
from __future__ import annotations

import importlib.util
from collections import defaultdict, namedtuple
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _float8, dtypes
from .dtypes import (float8_143, float8_152, float16, float32, float64, np_dtype_float8_143,
                     np_dtype_float8_152)

__all__ = ["host_pow2scale_cast_to_fp8", "host_pow2scale_cast_from_fp8", "host_fp8_mse_scale",
           "host_fp8_mse_scale_pb", "find_exponential_range", "log_histogram", "CandidateConfig",
           "calculate_metric_mse", "calculate_candidate_metric", "FpDef",
           "ieee_fp32_no_denorms", "ieee_fp16_denorms", "float8_143_def", "float8_152_def"]

# upstream: whether torch tensors can be passed (found without importing torch, which is slow)
torch_imported = importlib.util.find_spec("torch") is not None

max_scaling_bias = _float8.MSE_SCALE_RANGE[1]
min_scaling_bias = _float8.MSE_SCALE_RANGE[0]

FpDef = namedtuple("FpDef", ["num_exp_bits", "num_mantissa_bits", "fix_exponent_bias",
                             "include_denorm", "has_nans"])
FpDef.__doc__ = ("A floating point format: exponent and mantissa widths, exponent bias, "
                 "whether subnormals count, whether the top exponent code is Inf/NaN.")
ieee_fp32_no_denorms = FpDef(8, 23, 127, False, True)
ieee_fp16_denorms = FpDef(5, 10, 15, True, True)
float8_152_def = FpDef(5, 2, 16, True, False)
float8_143_def = FpDef(4, 3, 8, True, False)

_FLOAT8_NP = {float8_143: np_dtype_float8_143, float8_152: np_dtype_float8_152}
_FLOAT8_OF_NP = {np_dtype_float8_143: float8_143, np_dtype_float8_152: float8_152}
_FLOAT8_DEF = {float8_143: float8_143_def, float8_152: float8_152_def}
_HOST_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FROM_FP8_TARGETS = {float16: np.float16, float32: np.float32, float64: np.float64}


def _convert_popxl_float8_dtype_to_numpy(np_dtype: dtypes.dtype) -> np.dtype:
    """The structured NumPy dtype of float8 data of a popxl float8 dtype."""
    return _FLOAT8_NP[np_dtype]


def _convert_numpy_float8_dtype_to_popxl(np_dtype: np.dtype) -> dtypes.dtype:
    """The popxl float8 dtype of a float8 structured NumPy dtype."""
    try:
        return _FLOAT8_OF_NP[np.dtype(np_dtype)]
    except (KeyError, TypeError):
        raise RuntimeError(f"Not a float8 dtype ({np_dtype})") from None


def _as_array(src: Any) -> np.ndarray:
    if torch_imported and type(src).__module__.startswith("torch"):
        src = src.detach().cpu().numpy()
    return src if isinstance(src, np.ndarray) else np.asarray(src, order="C")


# --- casts ---------------------------------------------------------------------------------
def host_pow2scale_cast_to_fp8(src: Any, dtype: Optional[dtypes.dtype] = None,
                               log2_scale: int = 0, nan_on_overflow: bool = True) -> np.ndarray:
    """`cast(src * 2^log2_scale, dtype)` on the host.

    Rounds to nearest, ties to even. Values whose magnitude rounds above the format's largest
    (240 for float8_143, 57344 for float8_152) become NaN (code 0x80) with `nan_on_overflow`,
    else +-largest; +-inf and NaN become NaN either way (as upstream); -0 becomes +0.

    Args:
        src: float16, float32 or float64 host data (NumPy, Python sequences, torch tensors).
        dtype: `popxl.float8_143` or `popxl.float8_152`.
        log2_scale: an integer in [-32, 32).
        nan_on_overflow: NaN (True) or saturate (False) on overflow.

    Raises:
        RuntimeError: `dtype` is not a float8 dtype, or `src` is not float16/32/64 data.

    Returns:
        An array of the structured dtype `popxl.dtypes.np_dtype_float8_143` (or `_152`) with
        the shape of `src`.

    Example:
        >>> host_pow2scale_cast_to_fp8(np.array([1.0, 250.0]), popxl.float8_143).view(np.uint8)
        array([ 64, 128], dtype=uint8)
    """
    src = _as_array(src)
    if dtype not in _FLOAT8_NP:
        raise RuntimeError(f"dtype {dtype} not currently supported. host_pow2scale_cast_to_fp8 "
                           f"casts to popxl.float8_143 or popxl.float8_152")
    if src.dtype not in _HOST_FLOATS:
        raise RuntimeError(f"src.dtype {src.dtype} not currently supported. "
                           f"host_pow2scale_cast_to_fp8 casts float16, float32 or float64 data")
    s = _float8.check_log2_scale(log2_scale, "host_pow2scale_cast_to_fp8")
    codes = _float8.encode(src, _float8.format_of(dtype.name), s, bool(nan_on_overflow))
    if not nan_on_overflow:     # as upstream: +-inf is NaN even when finite overflow saturates
        codes = np.where(np.isinf(src), np.uint8(_float8.NAN_CODE), codes)
    return codes.view(_FLOAT8_NP[dtype])


def host_pow2scale_cast_from_fp8(src: np.ndarray, dtype: Optional[dtypes.dtype] = None,
                                 log2_scale: int = 0) -> np.ndarray:
    """`cast(src, dtype) * 2^log2_scale` on the host: float8 data back to real values.

    Args:
        src: float8 data: an array of `popxl.dtypes.np_dtype_float8_143` or `_152` (its dtype
            says which format the codes are in).
        dtype: the destination, `popxl.float16`, `popxl.float32` or `popxl.float64`.
        log2_scale: an integer in [-32, 32).

    Raises:
        RuntimeError: `src` is not float8 data, or `dtype` is not one of those three.

    Returns:
        An array of `dtype` with the shape of `src` (NaN codes give NaN). The value is computed
        exactly and rounded once to `dtype`.

    Example:
        >>> x8 = host_pow2scale_cast_to_fp8(np.array([0.75]), popxl.float8_143, 1)
        >>> host_pow2scale_cast_from_fp8(x8, popxl.float32, -1)
        array([0.75], dtype=float32)
    """
    src = _as_array(src)
    if src.dtype not in _FLOAT8_OF_NP:
        raise RuntimeError(f"src.dtype {src.dtype} not currently supported. "
                           f"host_pow2scale_cast_from_fp8 reads float8 data: arrays of "
                           f"popxl.dtypes.np_dtype_float8_143 or np_dtype_float8_152 (uint8 "
                           f"codes: codes.view(np_dtype_float8_143))")
    target = _FROM_FP8_TARGETS.get(dtype)
    if target is None:
        raise RuntimeError(f"dtype {dtype} not currently supported. host_pow2scale_cast_from_fp8 "
                           f"casts to popxl.float16, popxl.float32 or popxl.float64")
    s = _float8.check_log2_scale(log2_scale, "host_pow2scale_cast_from_fp8")
    fmt = _float8.format_of(_FLOAT8_OF_NP[src.dtype].name)
    values = _float8.decode(src.view(np.uint8).reshape(src.shape), fmt).astype(np.float64)
    with np.errstate(over="ignore"):
        return np.ldexp(values, s).astype(target)


# --- the MSE scale search ------------------------------------------------------------------
def find_exponential_range(fp_def: FpDef) -> Tuple[int, int]:
    """(smallest, largest) unbiased exponent `p - e` of a format without scaling: from the
    smallest normal exponent (minus the mantissa bits when subnormals count) to the largest
    exponent that is not reserved for Inf/NaN."""
    lo = 1 - fp_def.fix_exponent_bias
    hi = (1 << fp_def.num_exp_bits) - 1 - int(fp_def.has_nans) - fp_def.fix_exponent_bias
    if fp_def.include_denorm:
        lo -= fp_def.num_mantissa_bits
    return lo, hi


def log_histogram(src: np.ndarray, ftype: FpDef) -> Tuple[np.ndarray, List[float]]:
    """A histogram of the binary exponents of `|src|` (flattened) in the range of `ftype`.

    With `(lo, hi) = find_exponential_range(ftype)`, the limits are `2^lo, ..., 2^(hi-1)`.
    Bin 0 counts values below `2^lo`, the last bin values above `2^(hi-1)`, and bin `k + 1`
    (k = 0, 1, ...) the values in `[2^(lo+k), 2^(lo+k+1))`. A NaN falls in the bin of
    exponent 0 (`np.frexp` gives NaN the exponent 0), as upstream's per-value loop does.

    Returns:
        (float64 counts of `len(limits) + 1` bins, the limits as Python numbers).
    """
    lo, hi = find_exponential_range(ftype)
    limits = [2 ** i for i in range(lo, hi)]
    a = np.abs(np.asarray(src, dtype=np.float64).reshape(-1))
    _, e = np.frexp(a)
    bins = e.astype(np.int64) - lo
    bins[a < limits[0]] = 0
    bins[a > limits[-1]] = len(limits)
    histogram = np.bincount(bins, minlength=len(limits) + 1).astype(np.float64)
    return histogram, limits


class CandidateConfig:
    """One destination format of the search and the scales it can take.

    Attributes:
        format: the popxl float8 dtype.
        exponent_size, mantissa_size, fix_exponent_bias: of the destination format.
        quantisation_error: the relative squared rounding error, `2^(-2 (m_src - m_dest))` with
            `m_src` 23 for float32 sources and 10 otherwise.
        format_span: how many binades the destination covers.
        min_src_exp_index, max_src_exp_index: the range of histogram indices (of the source
            format's exponents) where the destination's range can start, given the scale range
            [min_scaling_bias, max_scaling_bias]; `num_exp_src` of them.
    """

    def __init__(self, format: dtypes.dtype, src_ftype: FpDef, dest_ftype: FpDef,  # noqa: A002
                 src_type: Any) -> None:
        self.format = format
        self.exponent_size = dest_ftype.num_exp_bits
        self.mantissa_size = dest_ftype.num_mantissa_bits
        self.fix_exponent_bias = dest_ftype.fix_exponent_bias
        src_mantissa = (ieee_fp32_no_denorms.num_mantissa_bits if src_type == np.float32
                        else ieee_fp16_denorms.num_mantissa_bits)
        self.quantisation_error = 2 ** (-2.0 * (src_mantissa - self.mantissa_size))
        src_lo, src_hi = find_exponential_range(src_ftype)
        dest_lo, dest_hi = find_exponential_range(dest_ftype)
        self.format_span = dest_hi - dest_lo + 1
        self.min_src_exp_index = max(dest_lo + min_scaling_bias - src_lo, 0)
        self.max_src_exp_index = min(dest_lo + max_scaling_bias - src_lo, src_hi - src_lo)
        self.num_exp_src = self.max_src_exp_index - self.min_src_exp_index + 1


def _mse_by_scale(histogram: np.ndarray, limits: Sequence[float],
                  src_bias_starting_indices: Sequence[int],
                  candidate: CandidateConfig) -> Dict[float, List[int]]:
    """{estimated mse: [scaling biases with it]} over the candidate start indices.

    For the start index `s` of scaling bias `b = position + min_scaling_bias`, the histogram
    bins below `s` underflow (each costs its limit squared, plus one fixed (limit_0 / 2)^2
    once), the `format_span` bins from `s` are rounded (limit squared times the quantisation
    error), and the bins above overflow (the squared distance from the limit at `position +
    format_span - 1`: upstream indexes the saturation limit by the candidate's position, not by
    its start index, and so does this estimate).
    """
    # Python arithmetic in upstream's order: the limits are exact (ints from 2^0 up), and
    # equal estimates must come out bit-equal for the tie rule to pick the same scale.
    h = [float(v) for v in histogram]
    n, span, qerr = len(limits), candidate.format_span, candidate.quantisation_error
    out: Dict[float, List[int]] = defaultdict(list)
    for position, start in enumerate(src_bias_starting_indices):
        start = int(start)
        mse = (limits[0] / 2) ** 2 if start > 0 else 0.0
        for i in range(min(start, n)):                      # underflow to zero
            mse += (limits[i] ** 2) * h[i + 1]
        for i in range(start, min(start + span, n)):        # rounding
            mse += limits[i] ** 2 * h[i + 1] * qerr
        saturated = limits[position + span - 1] if start + span < n else 0
        for i in range(start + span, n):                    # overflow
            mse += (saturated - limits[i]) ** 2 * h[i + 1]
        out[float(mse)].append(position + min_scaling_bias)
    return out


def calculate_metric_mse(histogram: np.ndarray, limits: Sequence[float],
                         src_bias_starting_indices: Sequence[int],
                         candidate: CandidateConfig) -> Tuple[float, int]:
    """(lowest estimated mse, its scaling bias) over the candidate start indices (see
    `CandidateConfig`); among equal lowest estimates, the middle scaling bias (the upper middle
    of an even count)."""
    by_mse = _mse_by_scale(histogram, limits, src_bias_starting_indices, candidate)
    lowest = min(by_mse)
    tied = sorted(by_mse[lowest])
    return lowest, tied[len(tied) // 2]


def calculate_candidate_metric(hist_norm: np.ndarray, limits: Sequence[float],
                               candidate: CandidateConfig,
                               metric_type: Optional[str] = None) -> Tuple[float, int]:
    """`calculate_metric_mse` over every start index the candidate allows; `metric_type` must
    be "MSE" (RuntimeError otherwise, as upstream)."""
    starts = np.arange(candidate.min_src_exp_index,
                       candidate.min_src_exp_index + candidate.num_exp_src)
    if metric_type != "MSE":
        raise RuntimeError("Only MSE metric is supported.")
    return calculate_metric_mse(hist_norm, limits, starts, candidate)


def _mse_search(src: Any, dtype: Optional[dtypes.dtype], what: str):
    """(normalised histogram, limits, candidate) of the search for `src` cast to `dtype`."""
    src = _as_array(src)
    if src.dtype not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise RuntimeError(f"dtype {src.dtype} not currently supported. {what} takes float16 "
                           f"or float32 data")
    if src.size == 0:
        raise ValueError(f"{what}: src is empty; there is no error to minimise")
    dest = float8_152_def if dtype is float8_152 else float8_143_def
    hist, limits = log_histogram(src, ieee_fp32_no_denorms)
    candidate = CandidateConfig(dtype, ieee_fp32_no_denorms, dest, src.dtype)
    return hist / hist.sum(), limits, candidate


def host_fp8_mse_scale(src: np.ndarray, dtype: Optional[dtypes.dtype] = None
                       ) -> Tuple[float, int]:
    """The log2 scale `s` for `host_pow2scale_cast_to_fp8(src, dtype, s)` that loses the
    least, estimated from a histogram of `src`'s exponents (upstream's algorithm).

    Args:
        src: float16 or float32 data.
        dtype: `popxl.float8_152`, else float8_143 (None included, as upstream).

    Raises:
        RuntimeError: `src` is not float16 or float32.

    Returns:
        `(estimated mse, s)` with `s` in [-31, 31]: the middle of the scales whose estimate is
        the lowest. Data closer to the format's overflow gives a negative scale, data closer
        to its underflow a positive one.

    Example:
        >>> _, s = host_fp8_mse_scale(np.array([0.00098, 240], np.float32), popxl.float8_143)
        >>> s
        0
    """
    hist_norm, limits, candidate = _mse_search(src, dtype, "host_fp8_mse_scale")
    metric, bias = calculate_candidate_metric(hist_norm, limits, candidate, "MSE")
    return metric, -bias


def host_fp8_mse_scale_pb(src: np.ndarray, dtype: Optional[dtypes.dtype] = None) -> int:
    """The log2 scale in [-31, 31] for casting `src` to `dtype` with the least loss: the
    estimate of `host_fp8_mse_scale`, taking the smallest of the scaling biases with the lowest
    estimate (so the largest such scale) instead of the middle one.

    Deviation: upstream asks Poplar's `calculateMetadataForConversion`, whose source is not
    public; upstream describes it as this estimate choosing the first best bias.

    Args:
        src: float16 or float32 data.
        dtype: `popxl.float8_143` or `popxl.float8_152`.

    Raises:
        RuntimeError: `dtype` is not a float8 dtype, or `src` is not float16 or float32.
    """
    if dtype not in _FLOAT8_NP:
        raise RuntimeError(f"dtype {dtype} not currently supported. host_fp8_mse_scale_pb "
                           f"takes popxl.float8_143 or popxl.float8_152")
    hist_norm, limits, candidate = _mse_search(src, dtype, "host_fp8_mse_scale_pb")
    starts = np.arange(candidate.min_src_exp_index,
                       candidate.min_src_exp_index + candidate.num_exp_src)
    by_mse = _mse_by_scale(hist_norm, limits, starts, candidate)
    return -min(by_mse[min(by_mse)])
