"""Named remote buffers: one buffer per named tensor or variable factory, and graphs (or inline
ops) that load / store every buffer at one entry.

Buffers with a meta_shape hold RTS shards (1-D, one per replica); see `rts.py` for the layout.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import popxl
from popxl import ops

from .dot_tree import DotTree
from .graph import GraphWithNamedArgs
from .named_tensors import NamedTensors
from .rts import replica_sharded_spec
from .utils import null_context
from .variable_factory import NamedVariableFactories

__all__ = [
    "NamedRemoteBuffers",
    "create_remote_buffer",
    "load_remote",
    "load_remote_graph",
    "named_buffers",
    "named_variable_buffers",
    "store_remote",
    "store_remote_graph",
]


class NamedRemoteBuffers(DotTree[popxl.RemoteBuffer]):
    """A DotTree of `popxl.RemoteBuffer`."""


def _tiles(use_io_tiles: bool):
    return popxl.io_tiles() if use_io_tiles else null_context()


def _check_entries(entries: object, what: str) -> int:
    if isinstance(entries, bool) or not isinstance(entries, (int, np.integer)) or entries < 1:
        raise ValueError(f"{what}: entries must be an int >= 1, got {entries!r}")
    return int(entries)


def create_remote_buffer(spec: popxl.TensorSpec, entries: int = 1,
                         replica_group: popxl.ReplicaGrouping | None = None,
                         shard_over: int | None = None) -> popxl.RemoteBuffer:
    """A remote buffer for tensors like `spec`.

    Args:
        spec: shape, dtype and meta_shape of one entry. A spec with a meta_shape is already a
            shard: the buffer gets that shape and meta_shape.
        entries: number of entries.
        replica_group: the grouping of the variables stored in it (default all replicas).
        shard_over: > 1 makes an RTS buffer holding 1-D shards of `spec.shape` over that many
            replicas (`popxl.replica_sharded_buffer`); the element count must be divisible.
    """
    what = "create_remote_buffer"
    if not isinstance(spec, popxl.TensorSpec):
        raise TypeError(f"{what}: 'spec' must be a popxl.TensorSpec, got {type(spec).__name__}")
    entries = _check_entries(entries, what)
    shape, dtype = tuple(spec.shape), spec.dtype
    if spec.meta_shape:
        buf = popxl.remote_buffer(shape, dtype, entries)
        buf.meta_shape = tuple(spec.meta_shape)
        return buf
    k = 1 if shard_over is None else shard_over
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{what}: shard_over must be an int >= 1, got {shard_over!r}")
    if k > 1:
        nelms = int(np.prod(shape, dtype=np.int64))
        if nelms % k:
            raise ValueError(f"Can't shard tensor with {nelms} elements over {k} replicas "
                             f"(shape {shape})")
        rg = replica_group if replica_group is not None else popxl.gcg().ir.replica_grouping()
        if rg.num_groups > 1:
            shape = (rg.num_groups, *shape)
        return popxl.replica_sharded_buffer(shape, dtype, rg, int(k), entries)
    return popxl.remote_buffer(shape, dtype, entries)


def named_buffers(tensors: NamedTensors, entries: int = 1,
                  shard_over: popxl.ReplicaGrouping | int | None = None
                  ) -> NamedRemoteBuffers:
    """One remote buffer per tensor, keyed like `tensors`.

    With `shard_over` (a grouping or a replica count > 1) each buffer holds the RTS shards of its
    tensor (see `replica_sharded_spec`: tensors that cannot be split evenly stay whole). Tensors
    that already are shards (have a meta_shape) get buffers of their own shape and meta_shape.

    Upstream's version (sdk-release-3.4) calls `replica_sharded_spec(t)` without its required
    second argument and always raises TypeError; this one works.
    """
    if not isinstance(tensors, NamedTensors):
        raise TypeError(f"named_buffers: 'tensors' must be NamedTensors, got "
                        f"{type(tensors).__name__}")
    entries = _check_entries(entries, "named_buffers")
    out = {}
    for name, t in tensors.to_dict().items():
        spec = replica_sharded_spec(t, shard_over) if shard_over is not None else \
            popxl.TensorSpec(t.shape, t.dtype, t.meta_shape)
        out[name] = create_remote_buffer(spec, entries)
    return NamedRemoteBuffers.from_dict(out)


def _shard_over_for(key: str, group_size: int, value: object) -> int:
    if isinstance(value, bool):
        return group_size if value else 1
    if isinstance(value, (int, np.integer)):
        if not 1 <= value <= group_size:
            raise ValueError(f"named_variable_buffers: shard_over for '{key}' must be between 1 "
                             f"and the replica group size {group_size}, got {value}")
        return int(value)
    raise TypeError(f"named_variable_buffers: shard_over for '{key}' must be a bool or an int, "
                    f"got {type(value).__name__}")


def named_variable_buffers(factories: NamedVariableFactories, entries: int = 1,
                           shard_over_dict: Mapping[str, int | bool] | int | bool = True
                           ) -> NamedRemoteBuffers:
    """One remote buffer per variable factory (keyed like `factories`), for `init_remote`.

    Args:
        factories: the variable factories.
        entries: entries per buffer.
        shard_over_dict: how many replicas each variable is sharded over: True = its replica
            group size, False = 1 (not sharded), an int, or a mapping {flat key: bool or int}
            (a missing key means the group size). Element counts must divide evenly.
    """
    if not isinstance(factories, NamedVariableFactories):
        raise TypeError(f"named_variable_buffers: 'factories' must be NamedVariableFactories, "
                        f"got {type(factories).__name__}")
    entries = _check_entries(entries, "named_variable_buffers")
    out = {}
    for key, f in factories.to_dict().items():
        size = f.replica_grouping.group_size
        if isinstance(shard_over_dict, Mapping):
            value = shard_over_dict.get(key, True)
        else:
            value = shard_over_dict
        k = _shard_over_for(key, size, value)
        spec = popxl.TensorSpec(f.shape, f.dtype, f.meta_shape)
        out[key] = create_remote_buffer(spec, entries, f.replica_grouping, k)
    return NamedRemoteBuffers.from_dict(out)


def _grow(buffer: popxl.RemoteBuffer, entries: int) -> None:
    buffer.entries = max(buffer.entries, entries)


def load_remote_graph(buffers: NamedRemoteBuffers, entries: int = 1,
                      use_io_tiles: bool = False) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph "load_remote": input int32 scalar `load_index`, one `remote_load` output per
    buffer in sorted-key order. Buffers grow to at least `entries` entries.

    Returns:
        `(graph, names)`. Usage: `NamedTensors.pack(names, graph.call(index))`.
    """
    if not isinstance(buffers, DotTree):
        raise TypeError(f"load_remote_graph: 'buffers' must be NamedRemoteBuffers, got "
                        f"{type(buffers).__name__}")
    entries = _check_entries(entries, "load_remote_graph")
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("load_remote")
    names, bufs = buffers.unpack()
    with graph, _tiles(use_io_tiles), popxl.transforms.merge_exchange(), \
            popxl.in_sequence(False):
        index = popxl.graph_input((), popxl.int32, "load_index")
        for name, buf in zip(names, bufs):
            _grow(buf, entries)
            popxl.graph_output(ops.remote_load(buf, index, name))
    return GraphWithNamedArgs(graph), list(names)


def store_remote_graph(buffers: NamedRemoteBuffers, entries: int = 1,
                       use_io_tiles: bool = False) -> GraphWithNamedArgs:
    """A graph "store_remote": first input int32 scalar `store_index`, then one named input per
    buffer (its shard shape and meta_shape), each stored with `remote_store`.

    Usage: `graph.bind(named_tensors).call(index)`.
    """
    if not isinstance(buffers, DotTree):
        raise TypeError(f"store_remote_graph: 'buffers' must be NamedRemoteBuffers, got "
                        f"{type(buffers).__name__}")
    entries = _check_entries(entries, "store_remote_graph")
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("store_remote")
    args = {}
    with graph, _tiles(use_io_tiles), popxl.transforms.merge_exchange(), \
            popxl.in_sequence(False):
        index = popxl.graph_input((), popxl.int32, "store_index")
        for name, buf in zip(*buffers.unpack()):
            _grow(buf, entries)
            t = popxl.graph_input(buf.tensor_shape, buf.tensor_dtype, name,
                                  meta_shape=buf.meta_shape or None)
            ops.remote_store(buf, index, t)
            args[name] = t
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args))


def load_remote(buffers: NamedRemoteBuffers, entry: int | popxl.Tensor = 0,
                use_io_tiles: bool = False) -> NamedTensors:
    """`remote_load` every buffer at `entry` in the current graph; keyed like `buffers`."""
    if not isinstance(buffers, DotTree):
        raise TypeError(f"load_remote: 'buffers' must be NamedRemoteBuffers, got "
                        f"{type(buffers).__name__}")
    out = {}
    with _tiles(use_io_tiles), popxl.transforms.merge_exchange(), popxl.in_sequence(False):
        for name, buf in zip(*buffers.unpack()):
            out[name] = ops.remote_load(buf, entry, name)
    return NamedTensors.from_dict(out)


def store_remote(buffers: NamedRemoteBuffers, tensors: NamedTensors,
                 entry: int | popxl.Tensor = 0, use_io_tiles: bool = False) -> None:
    """`remote_store` each tensor into the buffer of the same key, at `entry`. Every buffer key
    needs a tensor (extra tensors are an error too)."""
    if not isinstance(buffers, DotTree) or not isinstance(tensors, DotTree):
        raise TypeError("store_remote: 'buffers' must be NamedRemoteBuffers and 'tensors' "
                        "NamedTensors")
    bufs, ts = buffers.to_dict(), tensors.to_dict()
    if set(bufs) != set(ts):
        raise ValueError(f"store_remote: the keys of buffers and tensors differ: missing "
                         f"tensors {sorted(set(bufs) - set(ts))}, tensors without a buffer "
                         f"{sorted(set(ts) - set(bufs))}")
    with _tiles(use_io_tiles), popxl.transforms.merge_exchange(), popxl.in_sequence(False):
        for name in sorted(bufs):
            ops.remote_store(bufs[name], entry, ts[name])
