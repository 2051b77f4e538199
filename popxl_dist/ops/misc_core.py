"""Builders: identity / rename, detach(_), cast."""
from __future__ import annotations

from typing import Optional

from .. import dtypes
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["identity", "rename", "detach", "detach_", "cast"]


def identity(t: Tensor, output_name: Optional[str] = None) -> Tensor:
    """A copy of `t` (output named `identity_<name>` unless given)."""
    check_tensor(t, "identity", "t")
    return add_op("Identity", "identity", [t],
                  [Out(output_name or f"identity_{t.name}", t.shape, t.dtype, t.meta_shape)])[0]


rename = identity


def detach(t: Tensor) -> Tensor:
    """`t`'s value, with no gradient flowing back through it."""
    check_tensor(t, "detach", "t")
    return add_op("Detach", "detach", [t], [Out("detach_out", t.shape, t.dtype, t.meta_shape)])[0]


def detach_(t: Tensor) -> Tensor:
    """In-place (aliasing) detach."""
    check_tensor(t, "detach_", "t")
    return add_op("DetachInplace", "detach_inplace", [t],
                  [Out("detach_inplace_out", t.shape, t.dtype, t.meta_shape)])[0]


def cast(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """`t` converted to `data_type` (float to int truncates toward zero)."""
    check_tensor(t, "cast", "t")
    d = dtypes.dtype.as_dtype(data_type)
    if d in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"Data type {d} not supported for popxl.ops.cast, please consider "
                        f"pow2scale_cast_to_fp8 or pow2scale_cast_from_fp8")
    return add_op("Cast", "cast", [t], [Out(f"{t.name}_{d.name}", t.shape, d, t.meta_shape)],
                  {"to": d.name})[0]
