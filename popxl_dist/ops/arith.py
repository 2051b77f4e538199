"""Builders: add, sub, mul, div, negate (+ in-place add_) and scaled_add(_)."""
from __future__ import annotations

from typing import Union

from .. import dtypes
from ..tensor import Tensor
from ._builder import Out, add_op, broadcast_shape, check_same_dtype, check_tensor, meta_of
from .utils import check_tensor_ipu_and_tile_set

__all__ = ["add", "add_", "sub", "mul", "div", "negate", "scaled_add", "scaled_add_"]


def binary_op(op_type: str, settings: str, lhs: Tensor, rhs: Tensor,
              out_dtype: dtypes.dtype = None) -> Tensor:
    """Broadcasting element-wise op on two tensors of the same dtype."""
    check_tensor(lhs, settings, "lhs")
    check_tensor(rhs, settings, "rhs")
    check_tensor_ipu_and_tile_set(lhs=lhs, rhs=rhs)
    d = check_same_dtype(settings, lhs, rhs)
    shape = broadcast_shape(settings, lhs, rhs)
    return add_op(op_type, settings, [lhs, rhs],
                  [Out(f"{settings}_out", shape, out_dtype or d, meta_of(lhs, rhs))])[0]


def add(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise `lhs + rhs` with NumPy broadcasting."""
    return binary_op("Add", "add", lhs, rhs)


def add_(lhs: Tensor, rhs: Tensor) -> Tensor:
    """In place `lhs += rhs`; `lhs` must already have the broadcast shape. Returns lhs's alias."""
    check_tensor(lhs, "add_", "lhs")
    check_tensor(rhs, "add_", "rhs")
    check_tensor_ipu_and_tile_set(lhs=lhs, rhs=rhs)
    check_same_dtype("add_", lhs, rhs)
    shape = broadcast_shape("add_", lhs, rhs)
    if shape != lhs.shape:
        raise ValueError(f"add_: 'lhs' {lhs.id} {lhs.shape} must have the broadcast shape "
                         f"{shape} of lhs and rhs {rhs.shape}")
    return add_op("AddLhsInplace", "add_lhs_inplace", [lhs, rhs],
                  [Out("add_lhs_inplace_out", shape, lhs.dtype, meta_of(lhs, rhs))])[0]


def sub(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise `lhs - rhs`."""
    return binary_op("Sub", "sub", lhs, rhs)


def mul(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise `lhs * rhs`."""
    return binary_op("Mul", "mul", lhs, rhs)


def div(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise `lhs / rhs` (integer division truncates toward zero)."""
    return binary_op("Div", "div", lhs, rhs)


def negate(t: Tensor) -> Tensor:
    """Element-wise `-t`."""
    check_tensor(t, "negate", "t")
    return add_op("Neg", "negate", [t], [Out("negate_out", t.shape, t.dtype, t.meta_shape)])[0]


def _scaled_add_inputs(X: Tensor, Y: Tensor, a, b, name: str):
    check_tensor(X, name, "X")
    check_tensor(Y, name, "Y")
    if X.shape != Y.shape:
        raise ValueError(f"{name}: X '{X.id}' {X.shape} and Y '{Y.id}' {Y.shape} must have the "
                         f"same shape (no broadcasting)")
    ins, attrs = [X, Y], {}
    for key, v in (("a", a), ("b", b)):
        if isinstance(v, Tensor):
            if v.nelms != 1:
                raise ValueError(f"{name}: '{key}' must be a scalar tensor, got shape {v.shape}")
            ins.append(v)
            attrs[f"{key}_tensor"] = True
        else:
            attrs[key] = float(v)
    return ins, attrs


def scaled_add(X: Tensor, Y: Tensor, a: Union[float, Tensor] = 1.0,
               b: Union[float, Tensor] = 1.0) -> Tensor:
    """`a*X + b*Y` (same shapes; output has X's dtype)."""
    ins, attrs = _scaled_add_inputs(X, Y, a, b, "scaled_add")
    return add_op("ScaledAdd", "scaled_add", ins,
                  [Out("scaled_add_out", X.shape, X.dtype, X.meta_shape)], attrs)[0]


def scaled_add_(X: Tensor, Y: Tensor, a: Union[float, Tensor] = 1.0,
                b: Union[float, Tensor] = 1.0) -> Tensor:
    """In place `X = a*X + b*Y`. Returns X's alias."""
    ins, attrs = _scaled_add_inputs(X, Y, a, b, "scaled_add_")
    return add_op("ScaledAddLhsInplace", "scaled_add_lhs_inplace", ins,
                  [Out(f"scaled_add__{X.name}", X.shape, X.dtype, X.meta_shape)], attrs)[0]
