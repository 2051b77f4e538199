"""Replicated tensor sharding (RTS) helpers: shard specs, gathering shards into full tensors and
reducing full gradients into shards, inline or as graphs of named inputs.

Emulator layout (popxl core): an RTS tensor of n elements sharded over k replicas is the data
flattened, zero-padded to k*ceil(n/k) and cut into contiguous chunks; the member of rank i of the
all-gather group holds chunk i. For a variable with grouping (stride s, group size G) sharded
over k, that all-gather group is (stride s, group size k).
"""
from __future__ import annotations

import numpy as np
import popxl
from popxl import ops

from .graph import GraphWithNamedArgs
from .named_replica_grouping import NamedReplicaGrouping
from .named_tensors import NamedTensors
from .ops.replicated_strided_collectives import (
    replicated_all_gather_strided,
    replicated_all_reduce_strided,
    replicated_reduce_scatter_strided,
)
from .utils import null_context

__all__ = [
    "all_gather_replica_sharded_graph",
    "all_reduce_strided",
    "gather_replica_sharded_tensor",
    "reduce_replica_sharded_graph",
    "reduce_replica_sharded_tensor",
    "replica_sharded_spec",
    "replicated_all_gather_strided",
    "replicated_all_reduce_strided",
    "replicated_reduce_scatter_strided",
]

all_reduce_strided = replicated_all_reduce_strided

TensorLike = popxl.Tensor | popxl.TensorSpec


def _group_size(shard_over: popxl.ReplicaGrouping | int, what: str) -> int:
    if isinstance(shard_over, popxl.ReplicaGrouping):
        return shard_over.group_size
    if isinstance(shard_over, (int, np.integer)) and not isinstance(shard_over, bool) \
            and shard_over >= 1:
        return int(shard_over)
    raise TypeError(f"{what}: 'shard_over' must be a popxl.ReplicaGrouping or an int >= 1, got "
                    f"{shard_over!r}")


def replica_sharded_spec(t: TensorLike,
                         shard_over: popxl.ReplicaGrouping | int) -> popxl.TensorSpec:
    """The spec of `t`'s RTS shard over the replicas of `shard_over` (a grouping, or a count).

    Returns `t`'s own spec when `t` is already sharded (has a meta_shape), when the group has
    one replica, or when the element count is not divisible by the group size; otherwise
    `TensorSpec((nelms // size,), dtype, meta_shape=t.shape)`.
    """
    if not isinstance(t, (popxl.Tensor, popxl.TensorSpec)):
        raise TypeError(f"replica_sharded_spec: 't' must be a popxl.Tensor or TensorSpec, got "
                        f"{type(t).__name__}")
    size = _group_size(shard_over, "replica_sharded_spec")
    shape, dtype, meta = tuple(t.shape), t.dtype, tuple(t.meta_shape or ())
    spec = popxl.TensorSpec(shape, dtype, meta)
    nelms = int(np.prod(shape, dtype=np.int64))
    if meta or size == 1 or nelms % size:
        return spec
    return popxl.TensorSpec((nelms // size,), dtype, shape)


def gather_replica_sharded_tensor(t: popxl.Tensor, use_io_tiles: bool = False,
                                  replica_group: popxl.ReplicaGrouping | None = None
                                  ) -> popxl.Tensor:
    """The full tensor of an RTS shard (all-gathered over `replica_group`, default all
    replicas); a tensor without a meta_shape is returned as it is. With `use_io_tiles` the
    result is copied from the IO tiles (a numerical no-op)."""
    if not isinstance(t, popxl.Tensor):
        raise TypeError(f"gather_replica_sharded_tensor: 't' must be a popxl.Tensor, got "
                        f"{type(t).__name__}")
    if t.meta_shape:
        t = replicated_all_gather_strided(t, group=replica_group)
    if use_io_tiles:
        t = ops.io_tile_copy(t)
    return t


def _names_groups(names: list[str], groups: NamedReplicaGrouping | None,
                  default: popxl.ReplicaGrouping | None, what: str
                  ) -> list[popxl.ReplicaGrouping | None]:
    """The grouping of each name (`default` where `groups` is None or lacks the name)."""
    out = []
    for name in names:
        rg = default
        if groups is not None:
            if name not in groups:
                raise KeyError(f"{what}: no replica grouping for '{name}'. Available keys: "
                               f"{groups.keys_flat()}")
            rg = groups[name]
        if rg is not None and not rg.is_const:
            rg = rg.const_rg
        out.append(rg)
    return out


def all_gather_replica_sharded_graph(tensors: NamedTensors, use_io_tiles: bool = False,
                                     replica_groups: NamedReplicaGrouping | None = None
                                     ) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph "all_gather" gathering every sharded tensor into its full value.

    Args:
        tensors: the shards (or tensors like them): one named graph input each, with the same
            shape, dtype and meta_shape. Inputs without a meta_shape pass through unchanged.
        use_io_tiles: copy the results from the IO tiles (no numerical effect).
        replica_groups: the all-gather grouping per name (default all replicas).

    Returns:
        `(graph, names)`: outputs follow `names` (the sorted keys). Usage:
        `NamedTensors.pack(names, graph.bind(shards).call())`.
    """
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("all_gather")
    names, ts = tensors.unpack()
    names = list(names)
    groups = _names_groups(names, replica_groups, None, "all_gather_replica_sharded_graph")
    args = {}
    with graph, popxl.in_sequence(False):
        for name, t, rg in zip(names, ts, groups):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape or None)
            popxl.graph_output(gather_replica_sharded_tensor(x, use_io_tiles, rg))
            args[name] = x
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names


def reduce_replica_sharded_tensor(t: popxl.Tensor, op: str = "add",
                                  replica_group: popxl.ReplicaGrouping | None = None,
                                  shard_group: popxl.ReplicaGrouping | None = None
                                  ) -> popxl.Tensor:
    """Reduce `t` over `replica_group` and keep this replica's shard of the result.

    Args:
        t: the full tensor (e.g. a gradient).
        op: "add" or "mean".
        replica_group: the reduction group (default all replicas).
        shard_group: the group the result is sharded over (default `replica_group`).

    Returns:
        When the shard group has more than one replica and divides `t.nelms`: the 1-D shard
        (meta_shape `t.shape`) - a reduce-scatter when the groups are equal, otherwise an
        all-reduce followed by `replica_sharded_slice`. Otherwise the all-reduced full tensor.
    """
    if not isinstance(t, popxl.Tensor):
        raise TypeError(f"reduce_replica_sharded_tensor: 't' must be a popxl.Tensor, got "
                        f"{type(t).__name__}")
    ir = popxl.gcg().ir
    replica_group = replica_group if replica_group is not None else ir.replica_grouping()
    shard_group = shard_group if shard_group is not None else replica_group
    if shard_group.group_size > 1 and t.nelms % shard_group.group_size == 0:
        if replica_group == shard_group:
            return replicated_reduce_scatter_strided(
                t, op, replica_group, configure_output_for_replicated_tensor_sharding=True)
        t = replicated_all_reduce_strided(t, op, replica_group)
        return ops.collectives.replica_sharded_slice(t, group=shard_group)
    return replicated_all_reduce_strided(t, op, replica_group)


def reduce_replica_sharded_graph(tensors: NamedTensors, op: str = "add",
                                 use_io_tiles: bool = False,
                                 shard_groups: NamedReplicaGrouping | None = None,
                                 replica_group: popxl.ReplicaGrouping | None = None
                                 ) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph "replica_reduce" applying `reduce_replica_sharded_tensor` to every named input.

    Args:
        tensors: tensors like the full gradients (one named graph input each).
        op: "add" or "mean".
        use_io_tiles: build the graph on the IO tiles (no numerical effect).
        shard_groups: the shard grouping per name (default: `replica_group`).
        replica_group: the reduction group (default all replicas).

    Returns:
        `(graph, names)`: outputs follow `names` (sorted keys). Usage:
        `NamedTensors.pack(names, graph.bind(grads).call())`.
    """
    ir = popxl.gcg().ir
    replica_group = replica_group if replica_group is not None else ir.replica_grouping()
    graph = ir.create_empty_graph("replica_reduce")
    names, ts = tensors.unpack()
    names = list(names)
    groups = _names_groups(names, shard_groups, replica_group, "reduce_replica_sharded_graph")
    args = {}
    tiles = popxl.io_tiles() if use_io_tiles else null_context()
    with graph, tiles, popxl.in_sequence(False):
        for name, t, rg in zip(names, ts, groups):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape or None)
            popxl.graph_output(reduce_replica_sharded_tensor(x, op, replica_group, rg))
            args[name] = x
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names
