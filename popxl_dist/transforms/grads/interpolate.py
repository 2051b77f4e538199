"""Grad rules: Resize (interpolate) and ResizeGrad (a linear map: its adjoint is Resize)."""
from __future__ import annotations

from typing import List, Optional

from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]


@grad_rule("Resize")
def _resize_grad(g, dys) -> Grads:
    return [grad_op("ResizeGrad", [dys[0]], g.in_info(0), dict(g.attrs))]


@grad_rule("ResizeGrad")
def _resize_grad_grad(g, dys) -> Grads:
    return [grad_op("Resize", [dys[0]], g.in_info(0), dict(g.attrs), "interpolate")]
