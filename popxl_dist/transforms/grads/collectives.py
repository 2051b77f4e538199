"""Grad rules: collectives across replicas (as upstream), and AllReduce across IPUs.

ReplicatedAllReduce(Inplace) has no grad op upstream: autodiff stops there. A Local reduce-scatter
(replica_sharded_slice, replicated_slice) differentiates to an all-gather of the gradient; any
other reduce-scatter raises. An all-gather differentiates to each replica's own part of the
output gradient (a Local reduce-scatter).
"""
from __future__ import annotations

import numpy as np

from ... import ops
from ...context import gcg
from ...ops.collectives import (
    _all_reduce_ipus,
    replica_sharded_slice,
    replicated_all_gather,
    replicated_slice,
)
from ...tensor import Tensor, constant
from ..grad_registry import grad_rule, no_grad

__all__ = []

Grads = list[Tensor | None]

no_grad("ReplicatedAllReduce", "ReplicatedAllReduceInplace")


def _group(g):
    """The forward op's grouping, rebuilt on the current Ir from its plain attributes."""
    return gcg().ir.replica_grouping(g.attrs["stride"], g.attrs["group_size"])


@grad_rule("ReplicatedReduceScatter")
def _reduce_scatter_grad(g, dys) -> Grads:
    if g.attrs["op"] != "local":
        raise NotImplementedError(
            f"autodiff: the grad of {g.op.describe()} is only implemented when the collective "
            f"op is 'local' (upstream: 'grad op is only implemented when "
            f"CollectiveOperator==Local'), got op {g.attrs['op']!r}")
    info = g.in_info(0)
    n = info.nelms
    full = replicated_all_gather(dys[0], 0, _group(g), "concat")
    if full.shape[0] != n:      # drop the zero padding of the last chunk
        full = ops.slice(full, start=[0], stop=[n], axis=[0])
    return [ops.reshape(full, info.shape) if full.shape != info.shape else full]


@grad_rule("ReplicatedAllGather")
def _all_gather_grad(g, dys) -> Grads:
    dy = dys[0]
    info = g.in_info(0)
    group = _group(g)
    mode, k = g.attrs["mode"], g.attrs["group_size"]
    if mode == "concat":     # (a slice of size 1 drops its axis: back to the input's shape)
        dx = replicated_slice(dy, g.attrs["axis"], group)
        return [ops.reshape(dx, info.shape) if dx.shape != info.shape else dx]
    if mode == "new_axis":
        return [ops.reshape(replicated_slice(dy, 0, group), info.shape)]
    # meta_shape: this replica's shard of the (zero-padded) flat gradient.
    n = info.nelms
    if n == -(-dy.nelms // k):
        dx = replica_sharded_slice(dy, group)
    else:   # the shard is longer than ceil(nelms/k): pad the flat gradient to k*n first
        pad = constant(np.zeros((n * k - dy.nelms,), dy.dtype.as_numpy()), dy.dtype,
                       "all_gather_grad_pad")
        dx = replica_sharded_slice(ops.concat([ops.reshape(dy, (dy.nelms,)), pad], 0), group)
    return [ops.reshape(dx, info.shape) if dx.shape != info.shape else dx]


@grad_rule("AllReduce")
def _all_reduce_ipus_grad(g, dys) -> Grads:
    """The same op with the two `identical` flags swapped: an all-reduce of the output
    gradients becomes an identity where the outputs' gradients are identical, and the other
    way round. Only "add" is differentiable (as upstream)."""
    a = g.attrs
    if a["op"] != "add":
        raise NotImplementedError(f"autodiff: the grad of {g.op.describe()} is only defined for "
                                  f"op 'add', got {a['op']!r}")
    if a["identical_grad_inputs"]:
        return list(dys)
    dys = [d if d is not None else ops.init(g.out_info(i).shape, g.out_info(i).dtype,
                                            "zero_grad", "zero")
           for i, d in enumerate(dys)]
    return _all_reduce_ipus("all_reduce_grad", dys, list(a["ipus"]), "add",
                            a["identical_grad_inputs"], a["identical_inputs"])
