"""The fast float16 conversions of the kernels give NumPy's bits exactly (`astype`), including
subnormals, round-half-to-even ties, overflow to inf, NaN payloads, signed zeros, any shape."""
import numpy as np
import pytest

from popxl.engine.kernels._util import cast, from_f16, round_f16, to_f16

RNG = np.random.default_rng(11)
ALL_F16 = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16 if got.itemsize == 2 else np.uint32),
                                  want.view(np.uint16 if want.itemsize == 2 else np.uint32))


def test_from_f16_every_value():
    _same_bits(from_f16(ALL_F16), ALL_F16.astype(np.float32))
    _same_bits(from_f16(ALL_F16.reshape(256, 256)[::3, 1::2]),
               ALL_F16.reshape(256, 256)[::3, 1::2].astype(np.float32))


def _f32_cases():
    f32 = ALL_F16.astype(np.float32)
    bits = f32[np.isfinite(f32)].view(np.uint32).astype(np.int64)
    near = [(bits + d).clip(0, 2 ** 32 - 1).astype(np.uint32).view(np.float32)
            for d in (-1, 1, 4095, 4096, 4097, 8191)]         # neighbours and exact ties
    rand = RNG.integers(0, 2 ** 32, 2 * 10 ** 6, dtype=np.uint64).astype(np.uint32)
    scaled = [(RNG.standard_normal(10 ** 5) * s).astype(np.float32)
              for s in (1, 1e-3, 1e-5, 1e-7, 3e-8, 1e4, 7e4)]
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520,
                        -65520, 2 ** -14, -2 ** -14, 2 ** -24, 2 ** -25, -2 ** -25, 3 * 2 ** -25,
                        2 ** -26, 1e-40], np.float32)
    return [f32, *near, rand.view(np.float32), *scaled, special]


@pytest.mark.parametrize("case", range(len(_f32_cases())))
def test_to_f16_from_float32(case):
    v = _f32_cases()[case]
    with np.errstate(all="ignore"):
        want = v.astype(np.float16)
    _same_bits(to_f16(v), want)


@pytest.mark.parametrize("v", [np.array(-2.5e-6, np.float32), np.array(3.0, np.float32),
                               (RNG.standard_normal((37, 100)) * 1e-5).astype(np.float32)[:, ::3],
                               (RNG.standard_normal((3, 4, 5)) * 1e-6)])
def test_to_f16_shapes_and_float64(v):
    with np.errstate(all="ignore"):
        want = v.astype(np.float16)
    _same_bits(to_f16(v), want)


def test_to_f16_from_float64_subnormals_and_specials():
    v = np.concatenate([(RNG.standard_normal(10 ** 5) * 1e-6),
                        (np.arange(-2 ** 12, 2 ** 12) + 0.5) * 2.0 ** -24,
                        [0.0, -0.0, np.inf, np.nan, -2.0 ** -25, 65520.0]])
    with np.errstate(all="ignore"):
        _same_bits(to_f16(v), v.astype(np.float16))


def test_cast_helper():
    x = (RNG.standard_normal(10) * 1e-5).astype(np.float32)
    _same_bits(cast(x, np.dtype(np.float16)), x.astype(np.float16))
    h = x.astype(np.float16)
    _same_bits(cast(h, np.dtype(np.float32)), h.astype(np.float32))
    assert cast(x, np.dtype(np.float32)) is not x               # always a new array
    np.testing.assert_array_equal(cast(h, np.dtype(np.int32)), h.astype(np.int32))


@pytest.mark.parametrize("case", range(len(_f32_cases())))
def test_round_f16_gives_the_float16_values_in_float32(case):
    v = _f32_cases()[case]
    with np.errstate(all="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    _same_bits(round_f16(v), want)


def test_round_f16_without_out_of_range_values_and_strided():
    u = RNG.integers(0, 0x477FF000, 10 ** 6, dtype=np.uint64).astype(np.uint32)
    u |= RNG.integers(0, 2, u.size).astype(np.uint32) << 31           # both signs, no inf/NaN
    v = u.view(np.float32).reshape(1000, 1000)[:, ::3]
    _same_bits(round_f16(v), v.astype(np.float16).astype(np.float32))
