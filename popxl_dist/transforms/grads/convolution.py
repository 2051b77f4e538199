"""Grad rules: conv, conv_transpose (and their float8 forms), the pools, and the second-order
rules of their grad ops (ConvDataGrad, ConvWeightsGrad, AveragePoolGrad)."""
from __future__ import annotations

from typing import List, Optional

from ... import dtypes, ops
from ...ops._internal import grad_op
from ...tensor import Tensor, TensorSpec
from ..grad_registry import grad_rule
from ._common import same_attrs

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

_CONV_ATTRS = ("strides", "pads", "dilations", "group")


def _conv_family_grad(g, dy: Tensor, dx_type: str, swap_dw: bool) -> Grads:
    """[dx, dw(, None)] of a Conv or ConvTranspose: dx = `dx_type`(dy, w) and
    dw = ConvWeightsGrad(dy, x) (ConvTranspose: (x, dy)). The float8 form (3 inputs) computes
    both from the decoded operands in float32 and casts them to the operands' formats with the
    forward op's log2_scale."""
    attrs = {k: g.attrs[k] for k in _CONV_ATTRS}
    fp8 = g.num_inputs == 3
    x_info, w_info = g.in_info(0), g.in_info(1)
    if fp8:
        from .float8 import decoded

        dy = ops.cast(dy, dtypes.float32) if dy.dtype != dtypes.float32 else dy
        x, w = (lambda: decoded(g.fwd_in(0))), (lambda: decoded(g.fwd_in(1)))
    else:
        x, w = (lambda: g.fwd_in(0)), (lambda: g.fwd_in(1))
    dx = dw = None
    if g.needs(0):
        dx = grad_op(dx_type, [dy, w()], TensorSpec(x_info.shape, dy.dtype), attrs)
    if g.needs(1):
        ins = [x(), dy] if swap_dw else [dy, x()]
        dw = grad_op("ConvWeightsGrad", ins, TensorSpec(w_info.shape, dy.dtype), attrs)
    if not fp8:
        return [dx, dw]
    s = g.fwd_in(2)
    return [None if dx is None else ops.pow2scale_cast_to_fp8(dx, s, x_info.dtype),
            None if dw is None else ops.pow2scale_cast_to_fp8(dw, s, w_info.dtype), None]


@grad_rule("Conv")
def _conv_grad(g, dys) -> Grads:
    return _conv_family_grad(g, dys[0], "ConvDataGrad", swap_dw=False)


@grad_rule("ConvTranspose")
def _conv_transpose_grad(g, dys) -> Grads:
    """ConvTranspose is the input gradient of a conv: its gradients are that conv (for t) and
    the conv's weight gradient with the roles of t and dy swapped (upstream has none)."""
    return _conv_family_grad(g, dys[0], "Conv", swap_dw=True)


@grad_rule("AveragePool", "MaxPool")
def _pool_grad(g, dys) -> Grads:
    g.consumes(outs=(0,))                # upstream's pool grad ops take the pooled output too
    x = g.fwd_in(0)
    return [grad_op(f"{g.op.type}Grad", [dys[0], x], x, dict(g.attrs))]


@grad_rule("AveragePoolGrad")
def _avg_pool_grad_grad(g, dys) -> Grads:
    return [grad_op("AveragePool", [dys[0]], g.in_info(0), dict(g.attrs), "average_pool"), None]


@grad_rule("ConvDataGrad")
def _conv_data_grad_grad(g, dys) -> Grads:
    """dx = D(dy, w), bilinear: <G, D(dy, w)> = <conv(G, w), dy> = <W(dy, G), w>."""
    gg, attrs = dys[0], same_attrs(g, _CONV_ATTRS)
    d_dy = grad_op("Conv", [gg, g.fwd_in(1)], g.in_info(0), attrs, "conv") if g.needs(0) \
        else None
    d_w = grad_op("ConvWeightsGrad", [g.fwd_in(0), gg], g.in_info(1), attrs) if g.needs(1) \
        else None
    return [d_dy, d_w]


@grad_rule("ConvWeightsGrad")
def _conv_weights_grad_grad(g, dys) -> Grads:
    """dw = W(dy, x), bilinear: <G, W(dy, x)> = <conv(x, G), dy> = <D(dy, G), x>."""
    gg, attrs = dys[0], same_attrs(g, _CONV_ATTRS)
    d_dy = grad_op("Conv", [g.fwd_in(1), gg], g.in_info(0), attrs, "conv") if g.needs(0) \
        else None
    d_x = grad_op("ConvDataGrad", [g.fwd_in(0), gg], g.in_info(1), attrs) if g.needs(1) \
        else None
    return [d_dy, d_x]
