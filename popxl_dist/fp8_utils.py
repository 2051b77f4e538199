"""Host-side float8 casts. Not implemented yet: float8 storage is not emulated."""
from .dtypes import check_not_float8, float8_143

__all__ = ["host_pow2scale_cast_to_fp8", "host_pow2scale_cast_from_fp8", "host_fp8_mse_scale"]


def host_pow2scale_cast_to_fp8(src, dtype=None, log2_scale=0, nan_on_overflow=True):
    check_not_float8(float8_143, "host_pow2scale_cast_to_fp8")


def host_pow2scale_cast_from_fp8(src, dtype=None, log2_scale=0):
    check_not_float8(float8_143, "host_pow2scale_cast_from_fp8")


def host_fp8_mse_scale(src, dtype=None):
    check_not_float8(float8_143, "host_fp8_mse_scale")
