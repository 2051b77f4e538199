"""dtype lists used by tests of popxl programs."""
from .. import dtypes

__all__ = ["get_all_dtypes", "get_all_int_dtypes"]


def get_all_dtypes():
    """Every popxl dtype except the float8 types."""
    return [d for d in dtypes.dtype._by_name.values() if d not in dtypes.FLOAT8_DTYPES]


def get_all_int_dtypes(include_signed: bool = True, include_unsigned: bool = True):
    """The integer dtypes, signed and/or unsigned."""
    return [d for d in get_all_dtypes() if d.is_int and (
        (include_signed and d.is_signed) or (include_unsigned and not d.is_signed))]
