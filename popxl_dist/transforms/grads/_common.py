"""Helpers of the grad rule modules (not a rule module: grad_registry.load_all skips it)."""
from __future__ import annotations

from typing import Callable, List, Optional

from ...ops._internal import grad_op
from ...tensor import Tensor

__all__ = ["same_attrs", "activation_grad_grad"]

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
