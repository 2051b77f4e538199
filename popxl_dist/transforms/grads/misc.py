"""Grad rules: identity, cast and print_tensor (prints the gradient on request); detach and the
copies between IPUs / tile sets have none."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...ops._builder import Out, add_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

# Upstream: IpuCopy and IoTileCopy have no C++ grad op; detach stops the gradient.
no_grad("Detach", "DetachInplace", "IpuCopy", "IoTileCopy")


@grad_rule("Identity")
def _identity_grad(g, dys) -> Grads:
    return [dys[0]]


@grad_rule("Cast")
def _cast_grad(g, dys) -> Grads:
    src = g.in_info(0).dtype
    if not src.is_floating_point:
        return [None]
    return [ops.cast(dys[0], src)]


@grad_rule("PrintTensor")
def _print_tensor_grad(g, dys) -> Grads:
    dy, = dys
    attrs = dict(g.attrs)
    attrs.update(title=f"{attrs['title']}_gradient", print_self=attrs.get("print_gradient", False),
                 print_gradient=False)
    return add_op("PrintTensor", "print_tensor", [dy],
                  [Out("print_out", dy.shape, dy.dtype, dy.meta_shape)], attrs)
