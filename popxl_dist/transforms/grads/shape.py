"""Grad rules: reshape (squeeze is a Reshape), transpose, expand, slice, subsample, split,
concat, gather family, scatter(_reduce), dynamic slice/update and onehot; the second-order rules
of SliceGrad, SubsampleGrad, GatherGrad and ScatterDataGrad.

Scatter with duplicate indices: every duplicate's value gets the gradient of the written position
(upstream only the winning write would). ScatterReduce max/min: all elements equal to the result
get the gradient.
"""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad
from ._common import same_attrs

__all__ = []

Grads = List[Optional[Tensor]]

no_grad("DynamicUpdateInplace")  # modifying: autodiff refuses it, as upstream


def _zeros(info) -> Tensor:
    return ops.init(info.shape, info.dtype, "zeros", "zero")


@grad_rule("Slice", "SliceInplace")
def _slice_grad(g, dys) -> Grads:
    return [grad_op("SliceGrad", [dys[0]], g.in_info(0), {"slices": g.attrs["slices"]})]


@grad_rule("Subsample")
def _subsample_grad(g, dys) -> Grads:
    return [grad_op("SubsampleGrad", [dys[0]], g.in_info(0), {"strides": g.attrs["strides"]})]


@grad_rule("Split")
def _split_grad(g, dys) -> Grads:
    parts = [dy if dy is not None else _zeros(g.out_info(i)) for i, dy in enumerate(dys)]
    return [ops.concat(parts, g.attrs["axis"]) if len(parts) > 1 else ops.identity(parts[0])]


@grad_rule("Concat", "ConcatInplace")
def _concat_grad(g, dys) -> Grads:
    axis = g.attrs["axis"]
    out: Grads = []
    pos = 0
    for i in range(g.num_inputs):
        n = g.in_info(i).shape[axis]
        out.append(ops.slice(dys[0], pos, pos + n, 1, axis) if g.needs(i) else None)
        pos += n
    return out


@grad_rule("Gather", "TiedGather")
def _gather_grad(g, dys) -> Grads:
    attrs = {k: g.attrs[k] for k in ("axis", "group_size", "zero_OOR")}
    return [grad_op("GatherGrad", [dys[0], g.fwd_in(1)], g.in_info(0), attrs), None]


@grad_rule("Scatter")
def _scatter_grad(g, dys) -> Grads:
    dy, idx = dys[0], g.fwd_in(1)
    attrs = {"axis": g.attrs["axis"]}
    return [grad_op("ScatterDataGrad", [dy, idx], g.in_info(0), attrs) if g.needs(0) else None,
            None,
            grad_op("ScatterValuesGrad", [dy, idx], g.in_info(2), attrs) if g.needs(2) else None]


@grad_rule("ScatterReduce")
def _scatter_reduce_grad(g, dys) -> Grads:
    dy, idx, out = dys[0], g.fwd_in(1), g.fwd_out(0)
    attrs = {"axis": g.attrs["axis"], "reduction": g.attrs["reduction"],
             "data_shape": g.in_info(0).shape, "group_size": g.attrs.get("group_size", 1)}
    res: Grads = [None, None]
    if g.needs(0):
        res[0] = grad_op("ScatterReduceGrad", [dy, g.fwd_in(0), idx, out], g.in_info(0), attrs)
    if g.num_inputs > 2:
        res.append(grad_op("ScatterReduceInitGrad", [dy, g.fwd_in(2), idx, out], g.in_info(2),
                           attrs) if g.needs(2) else None)
    return res


def _window_args(g):
    return g.attrs["axes"], g.attrs["sizes"], g.attrs.get("no_overlap", False)


@grad_rule("DynamicSlice")
def _dynamic_slice_grad(g, dys) -> Grads:
    axes, sizes, no_overlap = _window_args(g)
    dx = ops.dynamic_update(_zeros(g.in_info(0)), g.fwd_in(1), dys[0], axes, sizes, no_overlap)
    return [dx, None]


@grad_rule("DynamicUpdate")
def _dynamic_update_grad(g, dys) -> Grads:
    axes, sizes, no_overlap = _window_args(g)
    dy, index = dys[0], g.fwd_in(1)
    dt = dupd = None
    if g.needs(0):
        dt = ops.dynamic_update(dy, index, _zeros(g.in_info(2)), axes, sizes, no_overlap)
    if g.needs(2):
        dupd = ops.dynamic_slice(dy, index, axes, sizes, no_overlap)
    return [dt, None, dupd]


@grad_rule("OneHot")
def _onehot_grad(g, dys) -> Grads:
    attrs = {"axis": g.attrs["axis"], "depth": g.attrs["depth"]}
    return [None, None, grad_op("OneHotGrad", [dys[0], g.fwd_in(0)], g.in_info(2), attrs)]


@grad_rule("Reshape", "ReshapeInplace")
def _reshape_grad(g, dys) -> Grads:
    return [ops.reshape(dys[0], g.in_info(0).shape)]


@grad_rule("Transpose", "TransposeInplace")
def _transpose_grad(g, dys) -> Grads:
    perm = list(g.attrs["perm"])
    inv = [perm.index(i) for i in range(len(perm))]
    return [ops.transpose(dys[0], inv)]


@grad_rule("Expand")
def _expand_grad(g, dys) -> Grads:
    return [g.unbroadcast(dys[0], g.in_info(0).shape)]


# --- second order: the grad ops are linear maps, their gradient is the adjoint ---------------


@grad_rule("SliceGrad")
def _slice_grad_grad(g, dys) -> Grads:
    return [grad_op("Slice", [dys[0]], g.in_info(0), same_attrs(g, ("slices",)), "slice")]


@grad_rule("SubsampleGrad")
def _subsample_grad_grad(g, dys) -> Grads:
    return [grad_op("Subsample", [dys[0]], g.in_info(0), same_attrs(g, ("strides",)), "subsample")]


@grad_rule("GatherGrad")
def _gather_grad_grad(g, dys) -> Grads:
    attrs = same_attrs(g, ("axis", "group_size", "zero_OOR"))
    return [grad_op("Gather", [dys[0], g.fwd_in(1)], g.in_info(0), attrs, "gather"), None]


@grad_rule("ScatterDataGrad")
def _scatter_data_grad_grad(g, dys) -> Grads:
    # a projection (zero where the scatter wrote): its own adjoint
    return [grad_op("ScatterDataGrad", [dys[0], g.fwd_in(1)], g.in_info(0), dict(g.attrs)),
            None]
