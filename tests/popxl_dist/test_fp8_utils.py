"""popxl.fp8_utils' MSE scale search against a reference written here in exact rational
arithmetic: the histogram of binary exponents, the per-scale cost (underflow, rounding,
overflow), and the two tie rules (middle scale for `host_fp8_mse_scale`, first best bias for
`host_fp8_mse_scale_pb`), plus upstream's documented examples."""
import math
from fractions import Fraction

import numpy as np
import pytest

import popxl
from popxl import fp8_utils
from popxl.fp8_utils import (CandidateConfig, calculate_candidate_metric, find_exponential_range,
                             host_fp8_mse_scale, host_fp8_mse_scale_pb, log_histogram)

# (mantissa bits, smallest and largest exponent) of the formats, from their definitions
RANGES = {"fp32": (23, -126, 127), "fp16": (10, -24, 15), "143": (3, -10, 7), "152": (2, -17, 15)}


def test_find_exponential_range():
    for name, fp in (("fp32", fp8_utils.ieee_fp32_no_denorms),
                     ("fp16", fp8_utils.ieee_fp16_denorms),
                     ("143", fp8_utils.float8_143_def), ("152", fp8_utils.float8_152_def)):
        assert find_exponential_range(fp) == RANGES[name][1:], name


def ref_histogram(x):
    """Counts of |x| per float32 binade: [0] below 2^-126, [k+1] in [2^(k-126), 2^(k-125)),
    [253] above 2^126."""
    h = [0] * 254
    for v in np.abs(np.asarray(x, np.float64)).ravel():
        if v < 2.0 ** -126:
            h[0] += 1
        elif v > 2.0 ** 126:
            h[253] += 1
        else:
            h[math.frexp(v)[1] + 126] += 1
    return h


def test_log_histogram():
    x = np.array([0.0, 1e-40, 2.0 ** -126, 0.75, -1.0, 1.5, 3.0, 2.0 ** 126, 2.0 ** 127, np.inf,
                  -1e38], np.float32)
    hist, limits = log_histogram(x, fp8_utils.ieee_fp32_no_denorms)
    assert limits == [2 ** k for k in range(-126, 127)]
    assert hist.dtype == np.float64 and hist.tolist() == ref_histogram(x)
    assert hist[126] == 1 and hist[127] == 2 and hist[128] == 1      # 0.75 | -1, 1.5 | 3


def ref_costs(x, dest, src_is_float32):
    """{scaling bias: exact cost} for casting x to `dest` ("143" / "152")."""
    h = ref_histogram(x)
    n = sum(h)
    h = [Fraction(c, n) for c in h]
    mant, lo, hi = RANGES[dest]
    span = hi - lo + 1
    qerr = Fraction(1, 2 ** (2 * ((23 if src_is_float32 else 10) - mant)))
    lim = [Fraction(2) ** k for k in range(-126, 127)]
    first = max(lo - 31 + 126, 0)
    costs = {}
    for pos, start in enumerate(range(first, min(lo + 31 + 126, 253) + 1)):
        cost = (lim[0] / 2) ** 2 if start > 0 else Fraction(0)
        cost += sum(lim[i] ** 2 * h[i + 1] for i in range(start))
        cost += sum(lim[i] ** 2 * h[i + 1] * qerr for i in range(start, min(start + span, 253)))
        # upstream saturates at the limit indexed by the position, not the start
        cost += sum((lim[pos + span - 1] - lim[i]) ** 2 * h[i + 1]
                    for i in range(start + span, 253))
        costs[pos - 31] = cost
    return costs


DATA = {
    "inside": lambda r: r.uniform(0.01, 100, 200),
    "near_overflow": lambda r: r.uniform(2 ** 5, 2 ** 6, 300),
    "near_underflow": lambda r: r.uniform(2 ** -6, 2 ** -5, 300),
    "wide": lambda r: np.clip(r.standard_t(2, 500) * 1e3, -6e4, 6e4),
    "tiny": lambda r: r.normal(size=100) * 1e-12,
}


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("src", [np.float16, np.float32])
@pytest.mark.parametrize("dest", ["143", "152"])
def test_mse_scales_match_the_exact_reference(data, src, dest):
    x = DATA[data](np.random.default_rng(3)).astype(src)
    dtype = {"143": popxl.float8_143, "152": popxl.float8_152}[dest]
    costs = ref_costs(x, dest, src == np.float32)
    best = min(costs.values())
    tied = sorted(b for b, c in costs.items() if c == best)
    mse, scale = host_fp8_mse_scale(x, dtype)
    assert scale == -tied[len(tied) // 2]
    assert math.isclose(mse, float(best), rel_tol=1e-12, abs_tol=1e-300)
    assert host_fp8_mse_scale_pb(x, dtype) == -tied[0]


def test_documented_examples_and_direction():
    """The format's own extremes need no scale; data near overflow gets a negative scale,
    data near underflow a positive one (upstream's examples)."""
    for src in (np.float16, np.float32):
        assert host_fp8_mse_scale(np.array([0.00098, 240], src), popxl.float8_143)[1] == 0
        assert host_fp8_mse_scale(np.array([2.0 ** -17, 57344], src), popxl.float8_152)[1] == 0
        rng = np.random.default_rng(0)
        assert host_fp8_mse_scale(rng.uniform(2 ** 5, 2 ** 6, 1000).astype(src),
                                  popxl.float8_143)[1] < 0
        assert host_fp8_mse_scale(rng.uniform(2 ** -6, 2 ** -5, 1000).astype(src),
                                  popxl.float8_143)[1] > 0
        s = host_fp8_mse_scale_pb(rng.random(12).astype(src), popxl.float8_152)
        assert isinstance(s, int) and -31 <= s <= 31


def test_candidate_config_and_metric_type():
    c = CandidateConfig(popxl.float8_143, fp8_utils.ieee_fp32_no_denorms,
                        fp8_utils.float8_143_def, np.dtype(np.float32))
    assert (c.format, c.exponent_size, c.mantissa_size, c.fix_exponent_bias) == \
        (popxl.float8_143, 4, 3, 8)
    assert c.quantisation_error == 2.0 ** -40 and c.format_span == 18
    assert (c.min_src_exp_index, c.max_src_exp_index, c.num_exp_src) == (85, 147, 63)
    c16 = CandidateConfig(popxl.float8_152, fp8_utils.ieee_fp32_no_denorms,
                          fp8_utils.float8_152_def, np.float16)
    assert c16.quantisation_error == 2.0 ** -16 and c16.format_span == 33
    hist, limits = log_histogram(np.ones(3), fp8_utils.ieee_fp32_no_denorms)
    with pytest.raises(RuntimeError, match="^Only MSE metric is supported."):
        calculate_candidate_metric(hist / hist.sum(), limits, c)


@pytest.mark.parametrize("call,match", [
    (lambda: host_fp8_mse_scale(np.ones(3, np.int32), popxl.float8_143),
     "^dtype int32 not currently supported"),
    (lambda: host_fp8_mse_scale(np.ones(3), popxl.float8_143),
     "^dtype float64 not currently supported"),
    (lambda: host_fp8_mse_scale_pb(np.ones(3, np.float32), popxl.float16),
     "^dtype popxl.dtypes.float16 not currently supported"),
])
def test_mse_scale_errors(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.parametrize("src_dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
def test_infinity_is_nan_even_when_finite_overflow_saturates(src_dtype, fmt):
    """As upstream's host cast: with nan_on_overflow=False a finite overflow saturates to
    +-largest, but +-inf (e.g. 70000 in float16) becomes NaN."""
    from popxl.fp8_utils import host_pow2scale_cast_to_fp8

    big = np.finfo(np.float16).max if src_dtype is np.float16 else 1e6
    src = np.array([big, -big, np.inf, -np.inf, np.nan], src_dtype)
    codes = host_pow2scale_cast_to_fp8(src, fmt, 0, False).view(np.uint8)
    np.testing.assert_array_equal(codes, [0x7F, 0xFF, 0x80, 0x80, 0x80])
    codes = host_pow2scale_cast_to_fp8(src, fmt, 0, True).view(np.uint8)
    np.testing.assert_array_equal(codes, [0x80] * 5)
