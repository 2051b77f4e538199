"""Grad rules: RoiAlign and RoiAlignGrad (a linear map in the data: its adjoint is RoiAlign)."""
from __future__ import annotations

from typing import List, Optional

from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]


@grad_rule("RoiAlign")
def _roi_align_grad(g, dys) -> Grads:
    dx = grad_op("RoiAlignGrad", [dys[0], g.fwd_in(1), g.fwd_in(2)], g.in_info(0), dict(g.attrs))
    return [dx, None, None]


@grad_rule("RoiAlignGrad")
def _roi_align_grad_grad(g, dys) -> Grads:
    return [grad_op("RoiAlign", [dys[0], g.fwd_in(1), g.fwd_in(2)], g.in_info(0),
                    dict(g.attrs), "roi_align"), None, None]
