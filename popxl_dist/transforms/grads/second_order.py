"""Grad rules of the dedicated grad op types: second-order gradients (autodiff of a gradient
graph).

Linear maps get their adjoint (a slice's gradient pads, so its adjoint slices; a conv's data
gradient is the transposed conv, so its adjoints are the conv and the weight gradient; ...).
Activation gradients get their derivative in both arguments, built from popxl ops.

Not differentiable (autodiff raises NotImplementedError naming the op): the remaining grad op
types (normalisation, nll, max-pool, top-k/median/max/min selection, scatter-reduce, pow/fmod,
swish, one-hot and the other reductions' gradients).
"""
from __future__ import annotations

import math
from typing import List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule

__all__: list = []

Grads = List[Optional[Tensor]]


def _same(g, keys) -> dict:
    return {k: g.attrs[k] for k in keys if k in g.attrs}


# --- linear maps: the gradient is the adjoint ------------------------------------------------
@grad_rule("SliceGrad")
def _slice_grad_grad(g, dys) -> Grads:
    return [grad_op("Slice", [dys[0]], g.in_info(0), _same(g, ("slices",)), "slice")]


@grad_rule("SubsampleGrad")
def _subsample_grad_grad(g, dys) -> Grads:
    return [grad_op("Subsample", [dys[0]], g.in_info(0), _same(g, ("strides",)), "subsample")]


@grad_rule("GatherGrad")
def _gather_grad_grad(g, dys) -> Grads:
    attrs = _same(g, ("axis", "group_size", "zero_OOR"))
    return [grad_op("Gather", [dys[0], g.fwd_in(1)], g.in_info(0), attrs, "gather"), None]


@grad_rule("ScatterDataGrad")
def _scatter_data_grad_grad(g, dys) -> Grads:
    # a projection (zero where the scatter wrote): its own adjoint
    return [grad_op("ScatterDataGrad", [dys[0], g.fwd_in(1)], g.in_info(0), dict(g.attrs)),
            None]


@grad_rule("CumSumGrad")
def _cumsum_grad_grad(g, dys) -> Grads:
    attrs = {"axis": g.attrs["axis"], "reverse": not g.attrs.get("reverse", True)}
    return [grad_op("CumSum", [dys[0]], g.in_info(0), attrs, "cumsum")]


@grad_rule("AveragePoolGrad")
def _avg_pool_grad_grad(g, dys) -> Grads:
    return [grad_op("AveragePool", [dys[0]], g.in_info(0), dict(g.attrs), "average_pool"), None]


@grad_rule("ResizeGrad")
def _resize_grad_grad(g, dys) -> Grads:
    return [grad_op("Resize", [dys[0]], g.in_info(0), dict(g.attrs), "interpolate")]


@grad_rule("RoiAlignGrad")
def _roi_align_grad_grad(g, dys) -> Grads:
    return [grad_op("RoiAlign", [dys[0], g.fwd_in(1), g.fwd_in(2)], g.in_info(0),
                    dict(g.attrs), "roi_align"), None, None]


_CONV = ("strides", "pads", "dilations", "group")


@grad_rule("ConvDataGrad")
def _conv_data_grad_grad(g, dys) -> Grads:
    """dx = D(dy, w), bilinear: <G, D(dy, w)> = <conv(G, w), dy> = <W(dy, G), w>."""
    gg, attrs = dys[0], _same(g, _CONV)
    d_dy = grad_op("Conv", [gg, g.fwd_in(1)], g.in_info(0), attrs, "conv") if g.needs(0) \
        else None
    d_w = grad_op("ConvWeightsGrad", [g.fwd_in(0), gg], g.in_info(1), attrs) if g.needs(1) \
        else None
    return [d_dy, d_w]


@grad_rule("ConvWeightsGrad")
def _conv_weights_grad_grad(g, dys) -> Grads:
    """dw = W(dy, x), bilinear: <G, W(dy, x)> = <conv(x, G), dy> = <D(dy, G), x>."""
    gg, attrs = dys[0], _same(g, _CONV)
    d_dy = grad_op("Conv", [g.fwd_in(1), gg], g.in_info(0), attrs, "conv") if g.needs(0) \
        else None
    d_x = grad_op("ConvDataGrad", [g.fwd_in(0), gg], g.in_info(1), attrs) if g.needs(1) \
        else None
    return [d_dy, d_x]


# --- activations: f'(x) * dy, differentiated in dy and in x ---------------------------------
def _zero(info) -> Tensor:
    return ops.init(info.shape, info.dtype, "zero_grad", "zero")


@grad_rule("ReluGrad", "ClipGrad")
def _mask_grad_grad(g, dys) -> Grads:
    """dx = dy * mask(x): d dy = G * mask(x); d x = 0 (almost everywhere)."""
    d_dy = grad_op(g.op.type, [dys[0], g.fwd_in(1)], g.in_info(0), dict(g.attrs))
    return [d_dy, _zero(g.in_info(1)) if g.needs(1) else None]


@grad_rule("TanhGrad")
def _tanh_grad_grad(g, dys) -> Grads:
    """dx = dy * (1 - y^2): d dy = G * (1 - y^2), d y = -2 y dy G."""
    gg, y = dys[0], g.fwd_in(1)
    d_dy = grad_op("TanhGrad", [gg, y], g.in_info(0)) if g.needs(0) else None
    d_y = ops.negate(y * g.fwd_in(0) * gg * 2.0) if g.needs(1) else None
    return [d_dy, d_y]


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


def _gelu_erf_second(x: Tensor) -> Tensor:
    """d^2/dx^2 of x Phi(x) = phi(x) (2 - x^2)."""
    x2 = x * x
    phi = ops.exp(x2 * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
    return phi * (2.0 - x2)


def _activation_grad_grad(op_type: str, second):
    def rule(g, dys) -> Grads:
        gg, x = dys[0], g.fwd_in(1)
        d_dy = grad_op(op_type, [gg, x], g.in_info(0)) if g.needs(0) else None
        d_x = g.fwd_in(0) * gg * second(x) if g.needs(1) else None
        return [d_dy, d_x]
    return rule


grad_rule("GeluGrad")(_activation_grad_grad("GeluGrad", _gelu_tanh_second))
grad_rule("GeluErfGrad")(_activation_grad_grad("GeluErfGrad", _gelu_erf_second))
