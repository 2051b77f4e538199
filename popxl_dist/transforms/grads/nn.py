"""Grad rules: normalisations and nll_loss; the fused nll_loss_with_softmax_grad has none."""
from __future__ import annotations

from typing import List, Optional

from ...ops._builder import Out, add_op
from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("NlllWithSoftmaxGradDirect")


@grad_rule("GroupNormalization")
def _group_norm_grad(g, dys) -> Grads:
    dy = dys[0]
    if dy is None:
        return [None, None, None]
    x, w = g.fwd_in(0), g.fwd_in(1)
    b_info = g.in_info(2)
    dx, dw, db = add_op("GroupNormalizationGrad", "group_norm_grad",
                        [dy, x, w, g.fwd_out(1), g.fwd_out(2)],
                        [Out("group_norm_grad_dx", x.shape, x.dtype, x.meta_shape),
                         Out("group_norm_grad_dweight", w.shape, w.dtype),
                         Out("group_norm_grad_dbias", b_info.shape, b_info.dtype)],
                        {"num_groups": g.attrs["num_groups"], "epsilon": g.attrs["epsilon"]})
    return [dx, dw, db]


@grad_rule("BatchNormalization")
def _batch_norm_grad(g, dys) -> Grads:
    dy, = dys
    x, scale = g.fwd_in(0), g.fwd_in(1)
    outs = [Out("batch_norm_grad_dx", x.shape, x.dtype, x.meta_shape)]
    outs += [Out(f"batch_norm_grad_d{n}", scale.shape, scale.dtype)
             for n in ("scale", "bias", "mean", "var")]
    res = add_op("BatchNormalizationGrad", "batch_norm_grad",
                 [dy, x, scale, g.fwd_in(3), g.fwd_in(4)], outs,
                 {"epsilon": g.attrs["epsilon"]})
    return [r if g.needs(i) else None for i, r in enumerate(res)]


@grad_rule("Nll")
def _nll_grad(g, dys) -> Grads:
    probs = g.fwd_in(0)
    return [grad_op("NllGrad", [dys[0], probs, g.fwd_in(1)], probs, dict(g.attrs)), None]
