"""Builders: the element-wise op family (unary math, activations, logic, comparisons, clip, pow,
fmod, maximum, where, increment_mod).

Deviations from upstream, on purpose:

* `pow(t, e)` with a Python number `e` makes `e` a constant of `t`'s dtype (upstream infers int32 /
  float32 from the Python type, so `x ** 2` on float tensors fails its dtype check).
* `log2` is in `__all__` (upstream reaches it as `popxl.ops.log2` but leaves it out of `__all__`).
"""
from __future__ import annotations

import math
from typing import Union

from .. import dtypes
from ..tensor import Tensor, constant
from ._builder import (Out, add_op, broadcast_shape, check_same_dtype, check_tensor, meta_of)
from .arith import binary_op

__all__ = [
    "abs", "exp", "exp_", "log", "log2", "sqrt", "sin", "cos", "tanh", "relu", "relu_",
    "geluerf", "geluerf_", "swish", "swish_", "ceil", "floor", "sign", "isnan", "isinf",
    "isfinite", "logical_not", "logical_and", "logical_or", "clip", "clamp", "pow", "fmod",
    "equal", "greater", "maximum", "where", "increment_mod", "increment_mod_",
]


def _unary(op_type: str, settings: str, t: Tensor, float_only: bool = False,
           out_dtype: dtypes.dtype = None, attrs=None) -> Tensor:
    """One-input element-wise op; the output has `t`'s shape (and dtype unless `out_dtype`)."""
    check_tensor(t, settings, "t")
    # float_only: an integer `t` builds, as upstream; the Session refuses it (see
    # session_checks.check_compilable_dtypes)
    return add_op(op_type, settings, [t],
                  [Out(f"{settings}_out", t.shape, out_dtype or t.dtype, t.meta_shape)],
                  attrs)[0]


def _unary_inplace(op_type: str, api: str, t: Tensor, float_only: bool = False,
                   attrs=None) -> Tensor:
    """Modifying in-place variant: writes into `t` and returns its alias `<api>_inplace_out`."""
    check_tensor(t, f"{api}_", "t")
    return add_op(op_type, f"{api}_inplace", [t],
                  [Out(f"{api}_inplace_out", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def _as_bool(t: Tensor, opname: str, argname: str) -> Tensor:
    from .misc import cast

    check_tensor(t, opname, argname)
    return t if t.dtype == dtypes.bool else cast(t, dtypes.bool)


# --- unary math -------------------------------------------------------------------------------

def abs(t: Tensor) -> Tensor:  # noqa: A001 - upstream name
    """Element-wise |t|."""
    return _unary("Abs", "abs", t)


def exp(t: Tensor) -> Tensor:
    """Element-wise e**t."""
    return _unary("Exp", "exp", t, float_only=True)


def exp_(t: Tensor) -> Tensor:
    """In-place e**t (modifies `t`, returns its alias)."""
    return _unary_inplace("ExpInplace", "exp", t, float_only=True)


def log(t: Tensor) -> Tensor:
    """Element-wise natural logarithm."""
    return _unary("Log", "log", t, float_only=True)


def log2(t: Tensor) -> Tensor:
    """Element-wise base-2 logarithm, built as upstream: `log(t) / log(constant(2))`."""
    check_tensor(t, "log2", "t")
    two = constant(2, t.dtype, "two")
    return binary_op("Div", "div", log(t), log(two))


def sqrt(t: Tensor) -> Tensor:
    """Element-wise square root."""
    return _unary("Sqrt", "sqrt", t, float_only=True)


def sin(t: Tensor) -> Tensor:
    """Element-wise sine."""
    return _unary("Sin", "sin", t, float_only=True)


def cos(t: Tensor) -> Tensor:
    """Element-wise cosine."""
    return _unary("Cos", "cos", t, float_only=True)


def tanh(t: Tensor) -> Tensor:
    """Element-wise hyperbolic tangent."""
    return _unary("Tanh", "tanh", t, float_only=True)


def ceil(t: Tensor) -> Tensor:
    """Element-wise ceiling (NaN propagates; zero gradient)."""
    return _unary("Ceil", "ceil", t)


def floor(t: Tensor) -> Tensor:
    """Element-wise floor (NaN propagates; zero gradient)."""
    return _unary("Floor", "floor", t)


def sign(t: Tensor) -> Tensor:
    """Element-wise sign: -1, 0 or 1 (sign(NaN) = 0; zero gradient)."""
    return _unary("Sign", "sign", t)


# --- activations ------------------------------------------------------------------------------

def relu(t: Tensor) -> Tensor:
    """Element-wise max(t, 0)."""
    return _unary("Relu", "relu", t)


def relu_(t: Tensor) -> Tensor:
    """In-place relu (modifies `t`, returns its alias)."""
    return _unary_inplace("ReluInplace", "relu", t)


def geluerf(t: Tensor) -> Tensor:
    """Exact GELU: 0.5 t (1 + erf(t / sqrt(2)))."""
    return _unary("GeluErf", "geluerf", t, float_only=True)


def geluerf_(t: Tensor) -> Tensor:
    """In-place exact GELU (modifies `t`, returns its alias)."""
    return _unary_inplace("GeluErfInplace", "geluerf", t, float_only=True)


def swish(t: Tensor) -> Tensor:
    """Swish / SiLU: t * sigmoid(t)."""
    return _unary("Swish", "swish", t, float_only=True)


def swish_(t: Tensor) -> Tensor:
    """In-place swish (modifies `t`, returns its alias)."""
    return _unary_inplace("SwishInplace", "swish", t, float_only=True)


# --- predicates and logic ---------------------------------------------------------------------

def isnan(t: Tensor) -> Tensor:
    """Element-wise NaN test (bool output)."""
    return _unary("IsNaN", "isnan", t, out_dtype=dtypes.bool)


def isinf(t: Tensor) -> Tensor:
    """Element-wise +-inf test (bool output)."""
    return _unary("IsInf", "isinf", t, out_dtype=dtypes.bool)


def isfinite(t: Tensor) -> Tensor:
    """Element-wise finiteness test, built as upstream: Not(Or(IsNaN, IsInf)) -> `isfinite_out`."""
    from .misc import identity

    check_tensor(t, "isfinite", "t")
    return identity(logical_not(logical_or(isnan(t), isinf(t))), "isfinite_out")


def logical_not(t: Tensor) -> Tensor:
    """Element-wise NOT; a non-bool input is cast to bool first."""
    return _unary("Not", "logical_not", _as_bool(t, "logical_not", "t"))


def logical_and(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise AND with broadcasting; non-bool inputs are cast to bool first."""
    return binary_op("And", "logical_and", _as_bool(lhs, "logical_and", "lhs"),
                     _as_bool(rhs, "logical_and", "rhs"))


def logical_or(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise OR with broadcasting; non-bool inputs are cast to bool first."""
    return binary_op("Or", "logical_or", _as_bool(lhs, "logical_or", "lhs"),
                     _as_bool(rhs, "logical_or", "rhs"))


def equal(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Element-wise `lhs == rhs` with broadcasting (same dtypes; bool output)."""
    return binary_op("Equal", "equal", lhs, rhs, dtypes.bool)


def greater(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002 - upstream name
    """Element-wise `input > other` with broadcasting (same dtypes; bool output)."""
    return binary_op("Greater", "greater", input, other, dtypes.bool)


# --- binary / n-ary arithmetic ----------------------------------------------------------------

def pow(t: Tensor, e: Union[Tensor, int, float]) -> Tensor:  # noqa: A001 - upstream name
    """Element-wise `t ** e` with broadcasting.

    Args:
        t: the base.
        e: a Tensor of `t`'s dtype, or a Python number (made a constant of `t`'s dtype).
    """
    check_tensor(t, "pow", "t")
    if not isinstance(e, Tensor):
        if isinstance(e, bool) or not isinstance(e, (int, float)):
            raise TypeError(f"pow: exponent must be a Tensor or a Python number, got {e!r}")
        if not t.dtype.is_floating_point and float(e) != math.floor(float(e)):
            raise TypeError(f"pow: exponent {e!r} is not integral but the base '{t.id}' has "
                            f"dtype {t.dtype.name}")
        e = constant(e, t.dtype, "pow_exponent")
    return binary_op("Pow", "pow", t, e)


def fmod(lhs: Tensor, rhs: Tensor) -> Tensor:
    """C fmod: remainder with the sign of the dividend, broadcasting."""
    return binary_op("Fmod", "fmod", lhs, rhs)


def maximum(*ts: Tensor) -> Tensor:
    """Element-wise maximum of one or more tensors (same dtype, broadcast together)."""
    if not ts:
        raise ValueError("maximum: needs at least one input tensor")
    for i, t in enumerate(ts):
        check_tensor(t, "maximum", f"ts[{i}]")
    d = check_same_dtype("maximum", *ts)
    shape = broadcast_shape("maximum", *ts)
    return add_op("Max", "maximum", list(ts), [Out("maximum_out", shape, d, meta_of(*ts))])[0]


def where(condition: Tensor, lhs: Tensor, rhs: Tensor) -> Tensor:
    """`lhs` where `condition` else `rhs`, broadcasting all three (condition cast to bool)."""
    check_tensor(condition, "where", "condition")
    check_tensor(lhs, "where", "lhs")
    check_tensor(rhs, "where", "rhs")
    d = check_same_dtype("where", lhs, rhs)
    shape = broadcast_shape("where", condition, lhs, rhs)
    c = _as_bool(condition, "where", "condition")
    return add_op("Where", "where", [c, lhs, rhs],
                  [Out("where_out", shape, d, meta_of(c, lhs, rhs))])[0]


def _clip_attrs(t: Tensor, opname: str, min, max):  # noqa: A002
    check_tensor(t, opname, "t")
    lo = -math.inf if min is None else min
    hi = math.inf if max is None else max
    for key, v in (("min", lo), ("max", hi)):
        if isinstance(v, Tensor) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{opname}: '{key}' must be a Python number, got {v!r}")
    return {"min": float(lo), "max": float(hi)}


def clip(t: Tensor, min: float = float("-inf"),  # noqa: A002 - upstream names
         max: float = float("inf")) -> Tensor:
    """Clamp `t` into [min, max] (Python numbers; if min > max every value becomes max)."""
    attrs = _clip_attrs(t, "clip", min, max)
    return add_op("Clip", "clip", [t], [Out("clip_out", t.shape, t.dtype, t.meta_shape)],
                  attrs)[0]


clamp = clip


def _increment_mod_attrs(t: Tensor, opname: str, increment, modulus):
    check_tensor(t, opname, "t")
    for key, v in (("increment", increment), ("modulus", modulus)):
        if isinstance(v, Tensor) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{opname}: '{key}' must be a Python number, got {v!r}")
    if modulus == 0:
        raise ValueError(f"{opname}: modulus must be non-zero")
    return {"increment": float(increment), "modulus": float(modulus)}


def increment_mod(t: Tensor, increment: float, modulus: float) -> Tensor:
    """`fmod(t + increment, modulus)` element-wise (no gradient)."""
    attrs = _increment_mod_attrs(t, "increment_mod", increment, modulus)
    return _unary("IncrementMod", "increment_mod", t, attrs=attrs)


def increment_mod_(t: Tensor, increment: float, modulus: float) -> Tensor:
    """In-place `t = fmod(t + increment, modulus)` (modifies `t`, returns its alias)."""
    attrs = _increment_mod_attrs(t, "increment_mod_", increment, modulus)
    return _unary_inplace("IncrementModInplace", "increment_mod", t, attrs=attrs)
