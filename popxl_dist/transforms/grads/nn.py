"""Grad rules: normalisations, nll_loss, dropout; random ops have none."""
from __future__ import annotations

from typing import List, Optional

from ... import dtypes, ops
from ...ops._builder import Out, add_op
from ...ops._internal import grad_op
from ...tensor import Tensor, TensorSpec
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("RandomUniform", "RandomNormal", "ModifyRandomSeed")


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


@grad_rule("Dropout", "ShapedDropout", "DropoutGrad")
def _dropout_grad(g, dys) -> Grads:
    # The same mask as the forward op: regenerated from the same seed.
    return [grad_op("DropoutGrad", [dys[0], g.fwd_in(1)], dys[0], dict(g.attrs)), None]


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
    x = g.fwd_in(0)
    return [grad_op(f"{g.op.type}Grad", [dys[0], x], x, dict(g.attrs))]


@grad_rule("Resize")
def _resize_grad(g, dys) -> Grads:
    return [grad_op("ResizeGrad", [dys[0]], g.in_info(0), dict(g.attrs))]


@grad_rule("RoiAlign")
def _roi_align_grad(g, dys) -> Grads:
    dx = grad_op("RoiAlignGrad", [dys[0], g.fwd_in(1), g.fwd_in(2)], g.in_info(0), dict(g.attrs))
    return [dx, None, None]
