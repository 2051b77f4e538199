"""Strided replica collectives (upstream's C++ custom ops `replicated_strided_collectives`),
written in Python on top of `popxl.ops.collectives`, whose groups already take any stride.

A group is a constant-stride `popxl.ReplicaGrouping` `(stride, group_size)`; None means every
replica. Replica r belongs to the group {base + i*stride}, base = (r // (stride*size)) *
stride*size + r % stride, and its rank in the group is (r % (stride*size)) // stride. Members
are reduced and gathered in rank order (ascending replica index).

The all-reduces are the op `ReplicatedAllReduceStrided`, whose gradient is the same op with
the `identical_inputs` / `identical_grad_inputs` flags swapped (as upstream; see
`popxl_addons.ops.replicated_all_reduce_TP` for the f/g semantics and the OpToIdentity
requirement of `replicated_all_reduce_strided_identical_inputs`). Upstream defines no gradient
for the all-gather and reduce-scatter; here the all-gather differentiates like
`ops.collectives.replicated_all_gather` (each replica's part of the output gradient) and the
reduce-scatter has none.
"""
from .replicated_all_gather_strided import replicated_all_gather_strided
from .replicated_all_reduce_strided import (
    replicated_all_reduce_strided,
    replicated_all_reduce_strided_graph,
    replicated_all_reduce_strided_identical_grad_inputs,
    replicated_all_reduce_strided_identical_inputs,
)
from .replicated_reduce_scatter_strided import replicated_reduce_scatter_strided

__all__ = [
    "replicated_all_gather_strided",
    "replicated_all_reduce_strided",
    "replicated_all_reduce_strided_graph",
    "replicated_all_reduce_strided_identical_grad_inputs",
    "replicated_all_reduce_strided_identical_inputs",
    "replicated_reduce_scatter_strided",
]
