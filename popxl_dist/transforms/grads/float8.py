"""Grad rules: the float8 casts and the pow2-scaled matmul (straight-through: the casts are
treated as the identity times 2^log2_scale; gradients of float8 tensors are float8)."""
from __future__ import annotations

from typing import List, Optional

from ... import dtypes, ops
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad
from ._common import matmul_operand_grads

__all__ = ["matmul_pow2scaled_grad", "decoded"]

Grads = List[Optional[Tensor]]

no_grad("Fp8Scale")      # a scale search, as upstream (its output is an integer)


@grad_rule("Pow2ScaleThenCast")
def _pow2scale_then_cast_grad(g, dys) -> Grads:
    """y = cast8(x * 2^s): dx = cast(dy) * 2^s, in x's dtype."""
    return [ops.pow2scale_cast_from_fp8(dys[0], g.fwd_in(1), g.in_info(0).dtype), None]


@grad_rule("CastThenPow2Scale")
def _cast_then_pow2scale_grad(g, dys) -> Grads:
    """y = cast(x8) * 2^s: dx = cast8(dy * 2^s), in x's float8 format."""
    dy = dys[0]
    if dy.dtype not in (dtypes.float16, dtypes.float32):
        dy = ops.cast(dy, dtypes.float32)
    return [ops.pow2scale_cast_to_fp8(dy, g.fwd_in(1), g.in_info(0).dtype), None]


def decoded(t: Tensor) -> Tensor:
    """The float32 values of a float8 tensor."""
    return ops.pow2scale_cast_from_fp8(t, 0, dtypes.float32)


def matmul_pow2scaled_grad(g, dy: Tensor) -> Grads:
    """y = (a @ b) * 2^s: da = cast8((dy @ b^T) * 2^s), db = cast8((a^T @ dy) * 2^s), each
    computed in float32 from the decoded operands and cast to its operand's float8 format."""
    s = g.fwd_in(2)
    dy = ops.cast(dy, dtypes.float32)
    da, db = matmul_operand_grads(g, dy, lambda: decoded(g.fwd_in(0)),
                                  lambda: decoded(g.fwd_in(1)))
    return [None if da is None else ops.pow2scale_cast_to_fp8(da, s, g.in_info(0).dtype),
            None if db is None else ops.pow2scale_cast_to_fp8(db, s, g.in_info(1).dtype),
            None]
