"""Grad rules: the element-wise family (unary math, activations, clip, pow, fmod, Max, Where) and
the second-order rules of ReluGrad, ClipGrad, TanhGrad and GeluErfGrad.

Max: every input equal to the output receives the full dy (upstream MaxArgGradOpx builds its
mask with `sign(x - y) + 1`, so tied inputs are not split).
"""
from __future__ import annotations

import math
from typing import List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...tensor import Tensor, constant
from ..grad_registry import grad_rule, no_grad, throws
from ._common import activation_grad_grad

__all__: List[str] = []

Grads = List[Optional[Tensor]]

no_grad("IsNaN", "IsInf", "IncrementMod",
        # modifying in-place variants: autodiff refuses graphs containing them
        "ExpInplace", "ReluInplace", "GeluErfInplace", "SwishInplace", "IncrementModInplace")
throws("Equal", "Greater", "And", "Or", "Not")


def _zero_like(t: Tensor) -> Tensor:
    return constant(0, t.dtype, "zero")


@grad_rule("Abs")
def _abs_grad(g, dys) -> Grads:
    return [ops.mul(dys[0], ops.sign(g.fwd_in(0)))]


@grad_rule("Exp")
def _exp_grad(g, dys) -> Grads:
    return [ops.mul(dys[0], g.fwd_out(0))]


@grad_rule("Log")
def _log_grad(g, dys) -> Grads:
    return [ops.div(dys[0], g.fwd_in(0))]


@grad_rule("Sqrt")
def _sqrt_grad(g, dys) -> Grads:
    y = g.fwd_out(0)
    return [ops.div(dys[0], ops.add(y, y))]


@grad_rule("Sin")
def _sin_grad(g, dys) -> Grads:
    return [ops.mul(dys[0], ops.cos(g.fwd_in(0)))]


@grad_rule("Cos")
def _cos_grad(g, dys) -> Grads:
    return [ops.negate(ops.mul(dys[0], ops.sin(g.fwd_in(0))))]


@grad_rule("Tanh")
def _tanh_grad(g, dys) -> Grads:
    y = g.fwd_out(0)
    return [grad_op("TanhGrad", [dys[0], y], y)]


@grad_rule("Relu")
def _relu_grad(g, dys) -> Grads:
    y = g.fwd_out(0)
    return [grad_op("ReluGrad", [dys[0], y], y)]


@grad_rule("GeluErf")
def _gelu_erf_grad(g, dys) -> Grads:
    x = g.fwd_in(0)
    return [grad_op("GeluErfGrad", [dys[0], x], x)]


@grad_rule("Swish")
def _swish_grad(g, dys) -> Grads:
    # Upstream's SwishGradOp takes x alone: swish(x) is recomputed from it (the same kernel,
    # the same bits as the forward output) rather than stashed.
    x = g.fwd_in(0)
    return [grad_op("SwishGrad", [dys[0], x, ops.swish(x)], x)]


@grad_rule("Ceil", "Floor", "Sign")
def _zero_grad(g, dys) -> Grads:
    info = g.in_info(0)
    return [ops.init(info.shape, info.dtype, "zero_grad", "zero")]


@grad_rule("Clip")
def _clip_grad(g, dys) -> Grads:
    x = g.fwd_in(0)
    return [grad_op("ClipGrad", [dys[0], x], x, {"min": g.attrs["min"], "max": g.attrs["max"]})]


@grad_rule("Pow")
def _pow_grad(g, dys) -> Grads:
    dy, = dys
    a, b = g.fwd_in(0), g.fwd_in(1)
    da = db = None
    if g.needs(0):
        da = g.unbroadcast(grad_op("PowArg0Grad", [dy, a, b], dy), g.in_info(0).shape)
    if g.needs(1):
        db = g.unbroadcast(grad_op("PowArg1Grad", [dy, a, g.fwd_out(0)], dy),
                           g.in_info(1).shape)
    return [da, db]


@grad_rule("Fmod")
def _fmod_grad(g, dys) -> Grads:
    dy, = dys
    if g.needs(0):      # as upstream's FmodArg0GradOp
        g.consumes(ins=(0, 1), outs=(0,))
    da = g.unbroadcast(dy, g.in_info(0).shape) if g.needs(0) else None
    db = None
    if g.needs(1):
        db = g.unbroadcast(grad_op("FmodArg1Grad", [dy, g.fwd_in(0), g.fwd_in(1)], dy),
                           g.in_info(1).shape)
    return [da, db]


@grad_rule("Max")
def _max_grad(g, dys) -> Grads:
    dy, = dys
    y = g.fwd_out(0)
    out: Grads = []
    for i in range(g.num_inputs):
        if not g.needs(i):
            out.append(None)
            continue
        dx = grad_op("MaxArgGrad", [dy, g.fwd_in(i), y], dy)
        out.append(g.unbroadcast(dx, g.in_info(i).shape))
    return out


@grad_rule("Where")
def _where_grad(g, dys) -> Grads:
    dy, = dys
    c = g.fwd_in(0)
    da = db = None
    if g.needs(1):
        da = g.unbroadcast(ops.where(c, dy, _zero_like(dy)), g.in_info(1).shape)
    if g.needs(2):
        db = g.unbroadcast(ops.where(c, _zero_like(dy), dy), g.in_info(2).shape)
    return [None, da, db]


# --- second order: the grad ops of the activations --------------------------------------------


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


def _gelu_erf_second(x: Tensor) -> Tensor:
    """d^2/dx^2 of x Phi(x) = phi(x) (2 - x^2)."""
    x2 = x * x
    phi = ops.exp(x2 * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
    return phi * (2.0 - x2)


grad_rule("GeluErfGrad")(activation_grad_grad("GeluErfGrad", _gelu_erf_second))
