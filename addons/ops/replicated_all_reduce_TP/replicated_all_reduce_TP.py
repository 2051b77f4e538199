"""The Megatron f/g pair of tensor-parallel layers as replicated all-reduces.

A tensor-parallel layer splits its weights over the replicas of a group. Its input is the same
on every member, and its partial outputs must be summed:

* `replicated_all_reduce_identical_inputs(x)` ("f"): forward identity, gradient all-reduce (the
  members' input gradients are partial sums of the true gradient);
* `replicated_all_reduce_identical_grad_inputs(y)` ("g"): forward all-reduce, gradient identity
  (every member receives the same output gradient).

`replicated_all_reduce` is a plain all-reduce whose gradient is an all-reduce too. All three are
the op `ReplicatedAllReduceTP`; its gradient is the same op with the two flags swapped.

As upstream, an op with identical inputs must be turned into an identity by the OpToIdentity
pattern before a Session runs the IR: `popxl_addons.transforms.autodiff` does this in the
gradient graphs it builds; call `popxl_addons.patterns.apply_pre_alias_patterns(ir)` when the
forward graph holds one, or `popxl.Session` raises "You need to run the `OpToIdentityPattern`
pattern before running the IR.".

`group` is a `popxl.ReplicaGrouping` (default all replicas); any constant stride is accepted.
`op` is any `popxl.ops.collectives` reduction; only "add" and "mean" have gradients.
"""
from __future__ import annotations

from typing import Optional

import popxl
from popxl.ops._tensor_parallel import ALL_REDUCE_TP, replicated_all_reduce_identical

__all__ = ["replicated_all_reduce", "replicated_all_reduce_identical_grad_inputs",
           "replicated_all_reduce_identical_inputs"]


def replicated_all_reduce_identical_inputs(t: popxl.Tensor, op: str = "add",
                                           group: Optional[popxl.ReplicaGrouping] = None
                                           ) -> popxl.Tensor:
    """Forward identity, gradient all-reduce over `group` (the input is identical on every
    member).

    Args:
        t: the replicated input of a tensor-parallel layer.
        op: the reduction of the gradient ("add" or "mean").
        group: the tensor-parallel replica grouping (default all replicas).

    Returns:
        `<t.name>_all_reduce`, equal to `t` once the OpToIdentity pattern has run.

    Example:
        >>> x = replicated_all_reduce_identical_inputs(x, group=tp_group)
        >>> y = x @ w_column_shard
    """
    return replicated_all_reduce_identical(
        "replicated_all_reduce_identical_inputs", ALL_REDUCE_TP, t, op, group, True, False)


def replicated_all_reduce_identical_grad_inputs(t: popxl.Tensor, op: str = "add",
                                                group: Optional[popxl.ReplicaGrouping] = None
                                                ) -> popxl.Tensor:
    """Forward all-reduce over `group`, gradient identity (the output gradient is identical on
    every member).

    Example:
        >>> y = replicated_all_reduce_identical_grad_inputs(h_row_shard @ w2, group=tp_group)
    """
    return replicated_all_reduce_identical(
        "replicated_all_reduce_identical_grad_inputs", ALL_REDUCE_TP, t, op, group, False, True)


def replicated_all_reduce(t: popxl.Tensor, op: str = "add",
                          group: Optional[popxl.ReplicaGrouping] = None) -> popxl.Tensor:
    """All-reduce over `group` whose gradient is the all-reduce of the output gradients."""
    return replicated_all_reduce_identical(
        "replicated_all_reduce", ALL_REDUCE_TP, t, op, group, False, False)
