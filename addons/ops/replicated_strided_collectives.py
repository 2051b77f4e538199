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
from __future__ import annotations

import popxl
from popxl import ops
from popxl.ops._tensor_parallel import ALL_REDUCE_STRIDED, replicated_all_reduce_identical

from ..graph import GraphWithNamedArgs
from ..named_tensors import NamedTensors
from ..utils import null_context

__all__ = [
    "replicated_all_gather_strided",
    "replicated_all_reduce_strided",
    "replicated_all_reduce_strided_graph",
    "replicated_all_reduce_strided_identical_grad_inputs",
    "replicated_all_reduce_strided_identical_inputs",
    "replicated_reduce_scatter_strided",
]

_STRIDED_REDUCE_OPS = ("add", "mean")


def _check_tensor(t: object, opname: str) -> popxl.Tensor:
    if not isinstance(t, popxl.Tensor):
        raise TypeError(f"{opname}: 't' must be a popxl.Tensor, got {type(t).__name__}")
    return t


def _check_group(group: popxl.ReplicaGrouping | None, opname: str
                 ) -> popxl.ReplicaGrouping | None:
    if group is None:
        return None
    if not isinstance(group, popxl.ReplicaGrouping):
        raise TypeError(f"{opname}: 'group' must be a popxl.ReplicaGrouping or None, got "
                        f"{type(group).__name__}")
    return group if group.is_const else group.const_rg


def _check_reduce_op(op: object, opname: str) -> str:
    if not isinstance(op, str) or op.lower() not in _STRIDED_REDUCE_OPS:
        raise ValueError(f"{opname}: op must be one of {_STRIDED_REDUCE_OPS}, got {op!r}")
    return op.lower()


def replicated_all_gather_strided(t: popxl.Tensor,
                                  group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Gather `t` from every member of its group, in rank order.

    Args:
        t: the tensor (an RTS shard when it has a `meta_shape`).
        group: constant-stride grouping (None: all replicas).

    Returns:
        A 1-D tensor of `group_size * t.nelms` elements, or, when `t` has a meta_shape, the
        gather truncated to `nelms(meta_shape)` and reshaped to `t.meta_shape`.

    Example:
        >>> full = replicated_all_gather_strided(shard, group=ir.replica_grouping(stride=2))
    """
    opname = "replicated_all_gather_strided"
    _check_tensor(t, opname)
    group = _check_group(group, opname)
    if t.meta_shape:
        return ops.collectives.replicated_all_gather(t, group=group, output_shape="meta_shape")
    flat = t.reshape((t.nelms,)) if t.rank != 1 else t
    return ops.collectives.replicated_all_gather(flat, axis=0, group=group,
                                                 output_shape="concat")


def replicated_reduce_scatter_strided(
        t: popxl.Tensor, op: str = "add", group: popxl.ReplicaGrouping | None = None,
        configure_output_for_replicated_tensor_sharding: bool = False) -> popxl.Tensor:
    """Reduce the flattened `t` over its group and give each member its chunk.

    The reduction is zero-padded to a multiple of the group size and cut into contiguous
    chunks; rank i gets chunk i.

    Args:
        t: the tensor to reduce.
        op: "add" or "mean".
        group: constant-stride grouping (None: all replicas).
        configure_output_for_replicated_tensor_sharding: give the output `meta_shape = t.shape`.

    Returns:
        A 1-D tensor of `ceil(t.nelms / group_size)` elements.
    """
    opname = "replicated_reduce_scatter_strided"
    _check_tensor(t, opname)
    op = _check_reduce_op(op, opname)
    group = _check_group(group, opname)
    return ops.collectives.replicated_reduce_scatter(
        t, op=op, group=group,
        configure_output_for_replicated_tensor_sharding=bool(
            configure_output_for_replicated_tensor_sharding))


def _all_reduce_strided(opname: str, t: popxl.Tensor, op: str,
                        group: popxl.ReplicaGrouping | None, identical_inputs: bool,
                        identical_grad_inputs: bool) -> popxl.Tensor:
    _check_tensor(t, opname)
    op = _check_reduce_op(op, opname)
    group = _check_group(group, opname)
    return replicated_all_reduce_identical(opname, ALL_REDUCE_STRIDED, t, op, group,
                                           identical_inputs, identical_grad_inputs)


def replicated_all_reduce_strided(t: popxl.Tensor, op: str = "add",
                                  group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Every member of the group gets the reduction of `t` over the group; the gradient is the
    all-reduce of the output gradients.

    Args:
        t: the tensor to reduce.
        op: "add" or "mean".
        group: constant-stride grouping (None: all replicas).
    """
    return _all_reduce_strided("replicated_all_reduce_strided", t, op, group, False, False)


def replicated_all_reduce_strided_identical_inputs(
        t: popxl.Tensor, op: str = "add",
        group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Forward identity (the input is identical on every member; needs the OpToIdentity
    pattern), gradient all-reduce over the group. Arguments as `replicated_all_reduce_strided`.
    """
    return _all_reduce_strided("replicated_all_reduce_strided_identical_inputs", t, op, group,
                               True, False)


def replicated_all_reduce_strided_identical_grad_inputs(
        t: popxl.Tensor, op: str = "add",
        group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Forward all-reduce over the group, gradient identity (the output gradient is identical
    on every member). Arguments as `replicated_all_reduce_strided`."""
    return _all_reduce_strided("replicated_all_reduce_strided_identical_grad_inputs", t, op,
                               group, False, True)


def replicated_all_reduce_strided_graph(tensors: NamedTensors, op: str = "add",
                                        group: popxl.ReplicaGrouping | None = None,
                                        use_io_tiles: bool = False
                                        ) -> tuple[GraphWithNamedArgs, list]:
    """A graph "all_reduce_strided" with one named input per tensor (sorted keys) and the
    all-reduced tensors as outputs, in the same order. Returns `(graph, names)`.

    (Upstream passes its arguments to the op in the wrong order; this follows the intent.)
    """
    opname = "replicated_all_reduce_strided_graph"
    op = _check_reduce_op(op, opname)
    group = _check_group(group, opname)
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("all_reduce_strided")
    names, args = [], {}
    tiles = popxl.io_tiles() if use_io_tiles else null_context()
    with graph, tiles, popxl.in_sequence(False):
        for name, t in zip(*tensors.unpack()):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape or None)
            popxl.graph_output(replicated_all_reduce_strided(x, op, group))
            args[name] = x
            names.append(name)
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names

