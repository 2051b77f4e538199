"""Grad rules: print_tensor (prints the gradient on request); copies and var_updates have none."""
from __future__ import annotations

from typing import List, Optional

from ...ops._builder import Out, add_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

# Upstream: IpuCopy and IoTileCopy have no C++ grad op; var_updates are modifying (no grad).
no_grad("IpuCopy", "IoTileCopy", "RemoteCodeLoad", "RemoteLoad", "RemoteLoadInplace", "RemoteStore",
        "Accumulate", "AccumulatorScale", "SparseAccumulate", "CopyVarUpdate",
        "AdamUpdater", "LambUpdater", "AdaMaxUpdater", "AdamVarUpdate")


@grad_rule("PrintTensor")
def _print_tensor_grad(g, dys) -> Grads:
    dy, = dys
    attrs = dict(g.attrs)
    attrs.update(title=f"{attrs['title']}_gradient", print_self=attrs.get("print_gradient", False),
                 print_gradient=False)
    return add_op("PrintTensor", "print_tensor", [dy],
                  [Out("print_out", dy.shape, dy.dtype, dy.meta_shape)], attrs)
