"""Grad rules: binary arithmetic (Add, Sub, Mul, Div, Neg); ScaledAdd has none."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("ScaledAdd")


@grad_rule("Add")
def _add_grad(g, dys) -> Grads:
    dy, = dys
    return [g.unbroadcast(dy, g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(dy, g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Sub")
def _sub_grad(g, dys) -> Grads:
    dy, = dys
    if g.needs(1):      # upstream's SubtractArg1GradOp takes both arguments and the output
        g.consumes(ins=(0, 1), outs=(0,))
    return [g.unbroadcast(dy, g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(ops.negate(dy), g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Mul")
def _mul_grad(g, dys) -> Grads:
    dy, = dys
    g.consumes(ins=(0, 1), outs=(0,))    # as upstream's MulArg0/1GradOp
    return [g.unbroadcast(ops.mul(dy, g.fwd_in(1)), g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(ops.mul(dy, g.fwd_in(0)), g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Div")
def _div_grad(g, dys) -> Grads:
    dy, = dys
    g.consumes(ins=(0, 1), outs=(0,))    # as upstream's DivArg0/1GradOp
    b = g.fwd_in(1)
    da = g.unbroadcast(ops.div(dy, b), g.in_info(0).shape) if g.needs(0) else None
    db = None
    if g.needs(1):
        db = g.unbroadcast(ops.negate(ops.div(ops.mul(dy, g.fwd_out(0)), b)), g.in_info(1).shape)
    return [da, db]


@grad_rule("Neg")
def _neg_grad(g, dys) -> Grads:
    return [ops.negate(dys[0])]
