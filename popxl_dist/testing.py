"""dtype lists used by tests of popxl programs."""
from . import dtypes

__all__ = ["get_all_dtypes", "get_all_int_dtypes"]


def get_all_dtypes():
    return [d for d in dtypes.dtype._by_name.values() if d not in dtypes.FLOAT8_DTYPES]


def get_all_int_dtypes():
    return [d for d in get_all_dtypes() if d.is_int]
