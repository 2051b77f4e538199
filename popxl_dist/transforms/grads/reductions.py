"""Grad rules: reductions (ReduceSum, ...), TopK and CumSum (and CumSumGrad, second order).
ArgMax/ArgMin/Histogram/LambSquare have no gradient.

ReduceMax/ReduceMin send the full `dy` to every element equal to the extremum (a mask, as
PopART's ReduceMaxGradOpx does); PyTorch's `amax` would split it equally among ties.
"""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...ops.shape import expand
from ...tensor import Tensor, constant
from ..grad_registry import grad_rule, no_grad

__all__ = []

Grads = List[Optional[Tensor]]

no_grad("ArgMax", "ArgMin", "Histogram", "LambSquare")


def _attrs(g):
    return {"axes": tuple(g.attrs["axes"]), "keepdims": bool(g.attrs.get("keepdims", False))}


@grad_rule("ReduceMean")
def _reduce_mean_grad(g, dys) -> Grads:
    in_shape = g.in_info(0).shape
    axes = g.attrs["axes"]
    n = 1
    for a in axes:
        n *= in_shape[a]
    keep = tuple(1 if i in axes else s for i, s in enumerate(in_shape))
    dy = dys[0]
    if dy.shape != keep:
        dy = ops.reshape(dy, keep)
    if dy.dtype.is_floating_point:
        dy = ops.mul(dy, constant(1.0 / n if n else 0.0, dy.dtype, "mean_scale"))
    else:
        dy = ops.div(dy, constant(n, dy.dtype, "mean_count"))
    return [expand(dy, in_shape) if dy.shape != in_shape else dy]


def _xy_rule(grad_type: str):
    """Rule for grad op types taking (dy, x, y) and the forward attrs."""

    def rule(g, dys) -> Grads:
        return [grad_op(grad_type, [dys[0], g.fwd_in(0), g.fwd_out(0)], g.in_info(0), _attrs(g))]
    return rule


for _t in ("ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"):
    grad_rule(_t)(_xy_rule(_t + "Grad"))


@grad_rule("ReduceSumSquare", "ReduceL1", "ReduceProd")
def _reduce_x_grad(g, dys) -> Grads:
    return [grad_op(g.op.type + "Grad", [dys[0], g.fwd_in(0)], g.in_info(0), _attrs(g))]


@grad_rule("ReduceMedian")
def _reduce_median_grad(g, dys) -> Grads:
    dy = dys[0]
    if dy is None:
        return [None]
    return [grad_op("ReduceMedianGrad", [dy, g.fwd_out(1)], g.in_info(0), _attrs(g))]


@grad_rule("TopK")
def _topk_grad(g, dys) -> Grads:
    dy = dys[0]
    if dy is None:
        return [None]
    return [grad_op("TopKGrad", [dy, g.fwd_out(1)], g.in_info(0), {"axis": g.attrs["axis"]})]


@grad_rule("CumSum")
def _cumsum_grad(g, dys) -> Grads:
    g.consumes(ins=(0,))                 # upstream's CumSumGradOp takes x
    return [grad_op("CumSumGrad", [dys[0]], g.in_info(0),
                    {"axis": g.attrs["axis"], "reverse": not g.attrs.get("reverse", False)})]


@grad_rule("ReduceSum")
def _reduce_sum_grad(g, dys) -> Grads:
    in_shape = g.in_info(0).shape
    axes = g.attrs["axes"]
    keep = tuple(1 if i in axes else s for i, s in enumerate(in_shape))
    dy = dys[0]
    if dy.shape != keep:
        dy = ops.reshape(dy, keep) if keep else dy
    return [expand(dy, in_shape) if dy.shape != in_shape else ops.identity(dy)]


@grad_rule("CumSumGrad")
def _cumsum_grad_grad(g, dys) -> Grads:
    attrs = {"axis": g.attrs["axis"], "reverse": not g.attrs.get("reverse", True)}
    return [grad_op("CumSum", [dys[0]], g.in_info(0), attrs, "cumsum")]
