"""Helpers of the grad rule modules (not a rule module: grad_registry.load_all skips it)."""
from __future__ import annotations

from typing import Callable, List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...tensor import Tensor

__all__ = ["same_attrs", "activation_grad_grad", "matmul_operand_grads"]

Grads = List[Optional[Tensor]]


def same_attrs(g, keys) -> dict:
    """The op's attributes named in `keys` (those it has)."""
    return {k: g.attrs[k] for k in keys if k in g.attrs}


def activation_grad_grad(op_type: str, second: Callable[[Tensor], Tensor]):
    """The second-order rule of an activation's grad op `op_type` (inputs dy, x; dx = dy f'(x)):
    d dy = `op_type`(G, x), d x = dy G f''(x), with `second(x)` = f''(x)."""
    def rule(g, dys) -> Grads:
        gg, x = dys[0], g.fwd_in(1)
        d_dy = grad_op(op_type, [gg, x], g.in_info(0)) if g.needs(0) else None
        d_x = g.fwd_in(0) * gg * second(x) if g.needs(1) else None
        return [d_dy, d_x]
    return rule


def _swap_last(t: Tensor) -> Tensor:
    perm = list(range(t.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ops.transpose(t, perm)


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
