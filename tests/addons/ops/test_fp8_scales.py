"""addons fp8_amax_scale and fp8_mse_scale against NumPy: the amax formula, and the
brute-force minimum of the float8 round-trip error over every candidate scale."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.fp8_utils import (host_fp8_mse_scale, host_pow2scale_cast_from_fp8,
                             host_pow2scale_cast_to_fp8)
from popxl_addons.ops.fp8_mse_scale import fp8_mse_scale

FMT_MAX = {popxl.float8_143: 240.0, popxl.float8_152: 57344.0}


def run(fn, x):
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream(x.shape, popxl.dtype.as_dtype(x.dtype))
        out = fn(ops.host_load(s))
        d = addons.host_store(out)
    with popxl.Session(ir, "ipu_hw") as sess:
        return sess.run({s: x})[d]


def brute_force_errors(x, dtype):
    """{scale: float64 squared error of the saturating round trip} for every scale."""
    x64 = x.astype(np.float64)
    errs = {}
    for s in range(-31, 32):
        q = host_pow2scale_cast_from_fp8(host_pow2scale_cast_to_fp8(x64, dtype, s, False),
                                         dtype, -s).astype(np.float64)
        errs[s] = float(np.sum(np.nan_to_num(q - x64) ** 2))
    return errs


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
    assert not np.isnan(host_pow2scale_cast_from_fp8(host_pow2scale_cast_to_fp8(x, dtype,
                                                                                int(got)))).any()


def test_fp8_amax_scale_limits():
    assert run(addons.fp8_amax_scale, np.zeros(3, np.float32)) == 31
    assert run(addons.fp8_amax_scale, np.full(3, 1e-30, np.float32)) == 31
    assert run(addons.fp8_amax_scale, np.full(3, 1e30, np.float32)) == -31
    with pytest.raises(TypeError, match="float8_143 or popxl.float8_152"):
        run(lambda t: addons.fp8_amax_scale(t, popxl.float16), np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("spread", [1e-6, 1e-3, 1.0, 3e3])
def test_fp8_mse_scale_is_the_brute_force_minimum(dtype, spread):
    x = (np.random.default_rng(1).standard_t(3, size=(30, 20)) * spread).astype(np.float32)
    x[0, 0] = np.nan                                         # ignored
    got = int(run(lambda t: fp8_mse_scale(t, dtype), x))
    errs = brute_force_errors(x, dtype)
    best = min(errs.values())
    assert errs[got] <= best * (1 + 1e-12)
    assert got == host_fp8_mse_scale(x, dtype)


def test_fp8_mse_scale_float16_input_and_ties():
    x = np.random.default_rng(2).normal(size=50).astype(np.float16)
    assert int(run(fp8_mse_scale, x)) == host_fp8_mse_scale(x)
    assert int(run(fp8_mse_scale, np.zeros(4, np.float32))) == -31   # all tie: smallest
