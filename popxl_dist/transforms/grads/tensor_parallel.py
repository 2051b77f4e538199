"""Grad rules: the tensor-parallel ops (see `ops/_tensor_parallel.py`).

The identical-flag all-reduces differentiate to the same op with the flags swapped (forward
all-reduce <-> identity), for "add" and "mean". The sharded cross entropy and the distributed
layer norm have dedicated grad ops; `GradReduceSquareAdd` has no gradient (it measures
gradients for clipping).
"""
from __future__ import annotations

from typing import List, Optional

from ...ops._builder import Out, add_op
from ...ops._internal import grad_op
from ...ops._tensor_parallel import replicated_all_reduce_identical
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("GradReduceSquareAdd")


@grad_rule("ReplicatedAllReduceTP", "ReplicatedAllReduceStrided")
def _all_reduce_tp_grad(g, dys) -> Grads:
    a = g.attrs
    if a["op"] not in ("add", "mean"):
        raise NotImplementedError(f"autodiff: the grad of {g.op.describe()} is only defined for "
                                  f"ops 'add' and 'mean', got {a['op']!r}")
    group = dys[0].ir.replica_grouping(a["stride"], a["group_size"])   # (no stash: as upstream)
    return [replicated_all_reduce_identical(
        f"{g.op.name.rsplit('/', 1)[-1]}_grad", g.op.type, dys[0], a["op"], group,
        a["identical_grad_inputs"], a["identical_inputs"])]


@grad_rule("CrossEntropySharded")
def _ce_sharded_grad(g, dys) -> Grads:
    ins = [dys[0], g.fwd_in(0), g.fwd_in(1), g.fwd_out(1)]
    if g.num_inputs == 3:
        ins.append(g.fwd_in(2))
    dx = grad_op("CrossEntropyShardedGrad", ins, g.fwd_in(0),
                 {"reduction": g.attrs["reduction"]}, "cross_entropy_sharded_grad")
    return [dx] + [None] * (g.num_inputs - 1)


@grad_rule("CrossEntropyShardedWR")
def _ce_sharded_wr_grad(g, dys) -> Grads:
    from ... import ops

    k = g.num_inputs // 2
    dls = [d if d is not None else ops.init((), g.out_info(i).dtype, "zero_grad", "zero")
           for i, d in enumerate(dys[:k])]
    logits = [g.fwd_in(i) for i in range(k)]
    ins = dls + logits + [g.fwd_in(k + i) for i in range(k)] + [g.fwd_out(k + i)
                                                                 for i in range(k)]
    dxs = add_op("CrossEntropyShardedWRGrad", "cross_entropy_sharded_wr_grad", ins,
                 [Out("cross_entropy_sharded_wr_grad_out", x.shape, x.dtype) for x in logits],
                 {"ipus": g.attrs["ipus"]})
    return dxs + [None] * k


@grad_rule("LayerNormDistributed")
def _ln_distributed_grad(g, dys) -> Grads:
    dy = dys[0]
    x, w = g.fwd_in(0), g.fwd_in(1)
    dx, dw, db = add_op("LayerNormDistributedGrad", "layer_norm_distributed_grad",
                        [dy, x, w, g.fwd_out(1), g.fwd_out(2)],
                        [Out("layer_norm_distributed_grad_dx", x.shape, x.dtype, x.meta_shape),
                         Out("layer_norm_distributed_grad_dweight", w.shape, w.dtype),
                         Out("layer_norm_distributed_grad_dbias", w.shape, w.dtype)],
                        {k: g.attrs[k] for k in ("stride", "group_size", "epsilon")})
    return [dx if g.needs(0) else None, dw if g.needs(1) else None,
            db if g.needs(2) else None]
