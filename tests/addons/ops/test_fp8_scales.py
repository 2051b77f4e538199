"""addons fp8_amax_scale and fp8_mse_scale against NumPy: the amax formula, and the on-device
MSE estimate (upstream's histogram search) written out here with scalar loops."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.fp8_utils import (host_fp8_mse_scale, host_pow2scale_cast_from_fp8,
                             host_pow2scale_cast_to_fp8)
from popxl_addons.ops.fp8_mse_scale import fp8_mse_scale

from fp8_reference import ref_device_scale

FMT_MAX = {popxl.float8_143: 240.0, popxl.float8_152: 57344.0}


def run(fn, x):
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream(x.shape, popxl.dtype.as_dtype(x.dtype))
        out = fn(ops.host_load(s))
        d = addons.host_store(out)
    with popxl.Session(ir, "ipu_hw") as sess:
        return sess.run({s: x})[d]


@pytest.mark.parametrize("dtype", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("src", [np.float16, np.float32])
@pytest.mark.parametrize("spread", [1e-4, 0.3, 100.0])
def test_fp8_amax_scale(dtype, src, spread):
    x = (np.random.default_rng(0).normal(size=(5, 7)) * spread).astype(src)
    got = run(lambda t: addons.fp8_amax_scale(t, dtype), x)
    want = np.clip(np.floor(np.log2(FMT_MAX[dtype] / np.abs(x.astype(np.float64)).max())),
                   -31, 31)
    assert got.dtype == np.int32 and got.shape == () and got == want
    # the largest scale that does not overflow
    assert not np.isnan(host_pow2scale_cast_from_fp8(
        host_pow2scale_cast_to_fp8(x, dtype, int(got)), popxl.float32)).any()


def test_fp8_amax_scale_limits():
    assert run(addons.fp8_amax_scale, np.zeros(3, np.float32)) == 31
    assert run(addons.fp8_amax_scale, np.full(3, 1e-30, np.float32)) == 31
    assert run(addons.fp8_amax_scale, np.full(3, 1e30, np.float32)) == -31
    with pytest.raises(TypeError, match="float8_143 or popxl.float8_152"):
        run(lambda t: addons.fp8_amax_scale(t, popxl.float16), np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("src", [np.float16, np.float32])
@pytest.mark.parametrize("lo,hi", [(2.0 ** 5, 2.0 ** 6), (2.0 ** -6, 2.0 ** -5), (1e-3, 3e3),
                                   (2.0 ** -20, 2.0 ** -18), (1e4, 6e4)])
def test_fp8_mse_scale_matches_the_documented_estimate(dtype, src, lo, hi):
    rng = np.random.default_rng(1)
    x = (np.exp(rng.uniform(np.log(lo), np.log(hi), size=(6, 5)))
         * rng.choice([-1, 1], size=(6, 5))).astype(src)
    got = run(lambda t: fp8_mse_scale(t, dtype), x)
    assert got.dtype == np.int32 and got.shape == ()
    assert int(got) == ref_device_scale(x, dtype)
    # as upstream's test: the device and host searches agree on data inside the range
    if lo >= 2.0 ** -6:
        assert int(got) == host_fp8_mse_scale(x, dtype)[1]


def test_fp8_mse_scale_direction_and_errors():
    """Data near the top of float8_143's range gets a negative scale, data near its bottom a
    positive one; non-float inputs and dtypes are refused as upstream."""
    x = np.random.default_rng(2).uniform(100, 200, 40).astype(np.float32)
    assert int(run(fp8_mse_scale, x)) < 0
    assert int(run(fp8_mse_scale, x * 2.0 ** -14)) > 0
    assert int(run(fp8_mse_scale, np.zeros(4, np.float32))) == ref_device_scale(
        np.zeros(4, np.float32), popxl.float8_143)
    ir = popxl.Ir()
    with ir.main_graph:
        i = popxl.variable(np.zeros(3, np.int32))
        f = popxl.variable(np.zeros(3, np.float32))
        with pytest.raises(RuntimeError, match="^dtype popxl.dtypes.int32 not currently supported"):
            fp8_mse_scale(i)
        with pytest.raises(TypeError, match="float8_143 or popxl.float8_152"):
            fp8_mse_scale(f, popxl.float16)
        fp8_mse_scale(f)
        op = ir.main_graph._pb_graph.getOps()[-1]
        assert op.opType() == "Fp8Scale" and str(op.opid) == "popxl.addons.ops.Fp8Scale:1"


def test_candidate_config_parameters():
    from popxl_addons.ops.fp8_mse_scale.fp8_mse_scale import CandidateConfig
    from popxl_addons.ops.fp8_utils import float8_143_def, float8_152_def, ieee_fp32_no_denorms
    c = CandidateConfig(popxl.float8_143, ieee_fp32_no_denorms, float8_143_def, np.float32)
    assert (c.num_exp_bits, c.num_mantissa_bits, c.fix_exponent_bias) == (4, 3, 8)
    assert c.format_span == 18 and c.min_src_exp == -10 - 31 + 126 and c.max_src_exp == 147
    assert c.num_exp_src == 63 and c.quantisation_error == 2.0 ** -40
    c = CandidateConfig(popxl.float8_152, ieee_fp32_no_denorms, float8_152_def, popxl.float32)
    assert c.format_span == 33 and c.min_src_exp == 78 and c.quantisation_error == 2.0 ** -16
