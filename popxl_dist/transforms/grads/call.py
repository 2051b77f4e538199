"""Grad rule: Call (the called graph's gradient graph, called with the forward values it needs)."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...tensor import Tensor
from ..grad_registry import grad_rule

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]


@grad_rule("Call")
def _call_grad(g, dys) -> Grads:
    from ..autodiff import ExpectedConnectionType

    op = g.op
    info = g.autodiff_called(op.called[0])
    cgd = info.forward_graph._data
    args = []
    for e in info.expected_inputs:
        ft = e.fwd_tensor
        if e.connection_type == ExpectedConnectionType.FwdGrad:
            k = cgd.outputs.index(ft.id) if ft.id in cgd.outputs else -1
            d = dys[k] if 0 <= k < len(dys) else None
            if d is None:
                d = ops.init(ft.shape, ft.dtype, "zero_grad", "zero")
            args.append(d)
        elif ft.id in cgd.inputs:
            args.append(g._b.fwd(op.inputs[cgd.inputs.index(ft.id)]))
        elif ft.id in cgd.outputs:
            args.append(g._b.fwd(op.outputs[cgd.outputs.index(ft.id)]))
        else:
            raise RuntimeError(f"autodiff: gradient graph '{info.graph.id}' needs '{ft.id}', which "
                               f"is neither an input nor an output of '{cgd.id}'")
    outs = ops.call(info.graph, *args)
    dxs: Grads = [None] * len(op.inputs)
    for e, o in zip(info.expected_outputs, outs):
        if e.fwd_tensor.id in cgd.inputs:
            dxs[cgd.inputs.index(e.fwd_tensor.id)] = o
    return dxs
