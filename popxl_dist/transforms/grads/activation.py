"""Grad rules: Gelu and Softmax, and the second-order rules of their grad ops (GeluGrad,
SoftmaxGrad)."""
from __future__ import annotations

import math
from typing import List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule
from ._common import activation_grad_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]


@grad_rule("Gelu")
def _gelu_grad(g, dys) -> Grads:
    x = g.fwd_in(0)
    return [grad_op("GeluGrad", [dys[0], x], x)]


@grad_rule("Softmax")
def _softmax_grad(g, dys) -> Grads:
    y = g.fwd_out(0)
    return [grad_op("SoftmaxGrad", [dys[0], y], y, {"axis": g.attrs["axis"]})]


@grad_rule("SoftmaxGrad")
def _softmax_grad_grad(g, dys) -> Grads:
    """dx = y * (dy - <dy, y>) along the axis (symmetric in dy): d dy = SoftmaxGrad(G, y),
    d y = G * (dy - <dy, y>) - dy * <G, y>."""
    gg, dy, y = dys[0], g.fwd_in(0), g.fwd_in(1)
    axis = g.attrs["axis"]
    d_dy = grad_op("SoftmaxGrad", [gg, y], g.in_info(0), {"axis": axis}) if g.needs(0) else None
    d_y = None
    if g.needs(1):
        s_dy = ops.sum(dy * y, axis, keepdims=True)
        s_g = ops.sum(gg * y, axis, keepdims=True)
        d_y = gg * (dy - s_dy) - dy * s_g
    return [d_dy, d_y]


def _gelu_tanh_second(x: Tensor) -> Tensor:
    """d^2/dx^2 of 0.5 x (1 + tanh(c (x + a x^3)))."""
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    x2 = x * x
    t = ops.tanh((x + x * x2 * a) * c)
    sech2 = 1.0 - t * t
    du = (x2 * (3.0 * a) + 1.0) * c
    d2u = x * (6.0 * a * c)
    return sech2 * (du + x * 0.5 * (d2u - t * du * du * 2.0))


grad_rule("GeluGrad")(activation_grad_grad("GeluGrad", _gelu_tanh_second))
