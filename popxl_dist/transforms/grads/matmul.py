"""Grad rule: MatMul (batch broadcasting as np.matmul; the float8 form in float8.py)."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...tensor import Tensor
from ..grad_registry import grad_rule

__all__ = ["matmul_operand_grads"]

Grads = List[Optional[Tensor]]


def _swap_last(t: Tensor) -> Tensor:
    perm = list(range(t.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ops.transpose(t, perm)


@grad_rule("MatMul")
def _matmul_grad(g, dys) -> Grads:
    dy, = dys
    if g.num_inputs == 3:                     # matmul_pow2scaled: see grads/float8.py
        from .float8 import matmul_pow2scaled_grad

        return matmul_pow2scaled_grad(g, dy)
    a_dtype = g.in_info(0).dtype
    if dy.dtype != a_dtype:
        dy = ops.cast(dy, a_dtype)
    return matmul_operand_grads(g, dy, lambda: g.fwd_in(0), lambda: g.fwd_in(1))


def matmul_operand_grads(g, dy: Tensor, lhs, rhs) -> Grads:
    """[d lhs, d rhs] of `lhs() @ rhs()` (np.matmul shapes, batch broadcasting) for the output
    gradient `dy`; `lhs` / `rhs` make the operands in the gradient graph when needed."""
    a_shape, b_shape = g.in_info(0).shape, g.in_info(1).shape
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    s = list(g.out_info(0).shape)
    if len(b_shape) == 1:
        s.append(1)
    if len(a_shape) == 1:
        s.insert(len(s) - 1, 1)
    out2 = tuple(s)
    dy2 = ops.reshape(dy, out2) if dy.shape != out2 else dy
    da = db = None
    if g.needs(0):
        b = rhs()
        b = ops.reshape(b, b2) if b.shape != b2 else b
        da = g.unbroadcast(ops.matmul(dy2, _swap_last(b)), a2)
        da = ops.reshape(da, a_shape) if da.shape != a_shape else da
    if g.needs(1):
        a = lhs()
        a = ops.reshape(a, a2) if a.shape != a2 else a
        db = g.unbroadcast(ops.matmul(_swap_last(a), dy2), b2)
        db = ops.reshape(db, b_shape) if db.shape != b_shape else db
    return [da, db]
