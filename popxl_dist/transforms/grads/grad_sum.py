"""Grad rule: Sum passes the output gradient to every input."""
from __future__ import annotations

from ..grad_registry import grad_rule

__all__: list = []   # registrations only


@grad_rule("Sum")
def _sum_grad(g, dys):
    dy, = dys
    return [dy] * g.num_inputs
