"""`VariableFactory`: delayed creation of main-graph variables for subgraph inputs.

Initialisation order follows upstream exactly so a seeded program draws the same numbers: a
callable `data_iter` is called once as a smoke test (the draw is thrown away), then wrapped as an
endless peekable generator and peeked once at construction (that second draw is what the first
`create_tensor` uses). `NamedVariableFactories.init` walks flat keys sorted as strings.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Optional, Tuple, Union

import numpy as np

import popdist
import popxl
from popxl import ops
from popxl.utils import downcast_np_dtypes, to_numpy

from .dot_tree import DotTree
from .named_replica_grouping import NamedReplicaGrouping
from .named_tensors import NamedTensors
from .utils import peekable, repeatfunc

__all__ = ["VariableFactory", "NamedVariableFactories", "add_variable_input",
           "add_replica_sharded_variable_input", "host_scalar_tensor_types"]

logger = logging.getLogger(__name__)
# What a data source may yield (torch tensors are also accepted, recognised by their module).
host_scalar_tensor_types = (float, int, bool, np.number, np.bool_, np.ndarray)


def _is_host_data(x: Any) -> bool:
    return isinstance(x, host_scalar_tensor_types) or type(x).__module__.startswith("torch")


def _shape_and_dtype(data: Any) -> Tuple[Tuple[int, ...], np.dtype]:
    """Shape and (downcast) NumPy dtype of host data, without converting a whole array."""
    if isinstance(data, np.ndarray):
        return tuple(data.shape), downcast_np_dtypes.get(data.dtype, data.dtype)
    arr = to_numpy(data, None, downcast=True, copy=False)
    return tuple(arr.shape), arr.dtype


class VariableFactory:
    """Creates a variable (and the matching graph input) from a data source.

    Args:
        data_iter: a zero-argument callable returning host data, or an iterable of host data.
        dtype: the variable dtype (default: inferred from the data, 64-bit downcast to 32).
        name: default name of inputs and variables.
        by_ref: whether graph inputs made by `create_input` are by reference.
        replica_grouping: default all replicas of the current Ir.
        shard_over: >1 makes the input replica-sharded (flat shard, `meta_shape` = full shape).
    """

    def __init__(self, data_iter: Union[Callable[[], Any], Iterable[Any]],
                 dtype: Optional[popxl.dtype] = None, name: Optional[str] = None,
                 by_ref: bool = False, replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                 shard_over: int = 1):
        if callable(data_iter):
            try:
                data_iter()
            except Exception as e:
                raise ValueError("Passed callable via `data_iter` throws error.") from e
            self.data_iter = peekable(repeatfunc(data_iter))
        elif _is_host_data(data_iter):  # extension: a single array is repeated
            arr = data_iter
            self.data_iter = peekable(repeatfunc(lambda: arr))
        elif isinstance(data_iter, Iterable):
            self.data_iter = peekable(data_iter)
        else:
            raise ValueError(f"`data_iter` must be an iterable or callable. Type: "
                             f"{type(data_iter)}")
        self.replica_grouping = replica_grouping or popxl.gcg().ir.replica_grouping()
        data = self.data_iter.peek()
        if not _is_host_data(data):
            raise ValueError(f"`data_iter` must yield NumPy arrays, torch tensors or Python "
                             f"scalars. Type: {type(data)}")
        shape, np_dt = _shape_and_dtype(data)
        self.dtype = popxl.dtype.as_dtype(dtype) if dtype is not None else \
            popxl.dtype.as_dtype(np_dt)
        self.name = name
        self.by_ref = by_ref
        self.shard_over = int(shard_over)
        self.replica_sharded = self.shard_over > 1
        full = shape
        if self.replica_sharded:
            n = int(np.prod(full))
            self.meta_shape: Tuple[int, ...] = full
            # ceil, as popxl's RTS buffers: a count that does not divide is zero-padded.
            self.shape: Tuple[int, ...] = (-(-n // self.shard_over),)
        else:
            self.meta_shape = ()
            self.shape = full

    @property
    def _full_shape(self) -> Tuple[int, ...]:
        return self.meta_shape if self.replica_sharded else self.shape

    def create_input(self, prefix: Optional[str] = None) -> popxl.Tensor:
        """A graph input of the current graph matching this factory."""
        name = self.name if prefix is None else f"{prefix}.{self.name}"
        return popxl.graph_input(self.shape, self.dtype, name, by_ref=self.by_ref,
                                 meta_shape=self.meta_shape or None)

    def next_data(self, empty: bool = False) -> np.ndarray:
        """The next host value (one independent draw per group, stacked, if several groups).

        `empty=True` draws nothing and gives zeros: upstream gives `np.empty` (uninitialised
        memory, e.g. for weights a program overwrites or a benchmark never reads back); zeros
        keep every run, process and popdist instance deterministic at the same cost (both are
        lazily mapped pages for large arrays)."""
        groups = self.replica_grouping.num_groups
        if empty:
            shape = self._full_shape if groups == 1 else (groups, *self._full_shape)
            return np.zeros(shape, self.dtype.as_numpy())

        def one():
            return to_numpy(next(self.data_iter), self.dtype)

        if groups == 1:
            return one()
        return np.stack([one() for _ in range(groups)])

    def next_memmap(self, memmap_dir: str, name: str, empty: bool = False,
                    read_only_if_exists: bool = False) -> np.memmap:
        """The next value as an `np.memmap` of the file `<memmap_dir>/<name>.npy`.

        As upstream, the file holds the raw array (no `.npy` header; read it back with
        `np.memmap` or `np.fromfile`), which is also what `TaskSession.save_checkpoint` copies.
        An existing file is opened read-only with `read_only_if_exists` (nothing is drawn).
        Otherwise popdist instance 0 writes the next value (every instance draws it, so the
        data sources stay in step) and, in a popdist run, every instance waits for it
        (`popdist.barrier`) before opening the file for reading and writing.
        """
        path = os.path.join(memmap_dir, f"{name}.npy")
        groups = self.replica_grouping.num_groups
        shape = tuple(self._full_shape if groups == 1 else (groups, *self._full_shape))
        dtype = self.dtype.as_numpy()
        if read_only_if_exists and os.path.exists(path):
            want = int(np.prod(shape)) * dtype.itemsize
            if os.path.getsize(path) != want:
                raise ValueError(f"next_memmap: '{path}' holds {os.path.getsize(path)} bytes, "
                                 f"the variable needs {want} ({shape} {dtype})")
            return np.memmap(path, dtype, mode="r", shape=shape)
        data = None if empty else self.next_data()
        if popdist.getInstanceIndex() == 0:
            os.makedirs(memmap_dir, exist_ok=True)
            mm = np.memmap(path, dtype, mode="w+", shape=shape)
            if data is not None:
                mm[...] = data
            mm.flush()
            del mm
        popdist.barrier()
        return np.memmap(path, dtype, mode="r+", shape=shape)

    def _next_value(self, name: Optional[str], empty: bool, memmap_dir: Optional[str],
                    read_only_if_exists: bool):
        """The next host value, in a memmap under `memmap_dir` when given."""
        if memmap_dir is not None:
            return self.next_memmap(memmap_dir, name or "variable", empty, read_only_if_exists)
        return self.next_data(empty)

    def create_tensor(self, name: Optional[str] = None, empty: bool = False,
                      memmap_dir: Optional[str] = None,
                      read_only_if_exists: bool = False) -> popxl.Variable:
        """A main-graph variable holding the next value (full, unsharded)."""
        name = name or self.name
        data = self._next_value(name, empty, memmap_dir, read_only_if_exists)
        return popxl.variable(data, self.dtype, name, replica_grouping=self.replica_grouping)

    def create_remote_tensor(self, buffer: popxl.RemoteBuffer, entry: int,
                             name: Optional[str] = None, empty: bool = False,
                             memmap_dir: Optional[str] = None,
                             read_only_if_exists: bool = False) -> popxl.Variable:
        """A remote variable in `buffer` at `entry` (replica-sharded if the buffer is)."""
        name = name or self.name
        data = self._next_value(name, empty, memmap_dir, read_only_if_exists)
        if buffer.meta_shape:
            return popxl.remote_replica_sharded_variable(data, buffer, entry, self.dtype, name,
                                                         replica_grouping=self.replica_grouping)
        return popxl.remote_variable(data, buffer, entry, self.dtype, name,
                                     replica_grouping=self.replica_grouping)


class NamedVariableFactories(DotTree[VariableFactory]):
    """A DotTree of `VariableFactory`."""

    def _sorted(self):
        return sorted(self.to_dict().items(), key=lambda kv: kv[0])

    def init(self, prefix: Optional[str] = None, empty: bool = False,
             memmap_dir: Optional[str] = None, read_only_if_exists: bool = False) -> NamedTensors:
        """One main-graph variable per factory, created in flat-key string order.

        Variables are named `<prefix>.<key>` (or `<key>`).
        """
        out = {}
        for key, f in self._sorted():
            name = f"{prefix}.{key}" if prefix else key
            out[key] = f.create_tensor(name, empty, memmap_dir, read_only_if_exists)
        return NamedTensors.from_dict(out)

    def init_remote(self, buffers: DotTree, entry: int = 0, prefix: Optional[str] = None,
                    empty: bool = False, memmap_dir: Optional[str] = None,
                    read_only_if_exists: bool = False) -> NamedTensors:
        """Remote variables, one per factory, in the buffer of the same key."""
        bufs = buffers.to_dict()
        out = {}
        for key, f in self._sorted():
            name = f"{prefix}.{key}" if prefix else key
            out[key] = f.create_remote_tensor(bufs[key], entry, name, empty, memmap_dir,
                                              read_only_if_exists)
        return NamedTensors.from_dict(out)

    def _init_type(self, init_type: str) -> NamedTensors:
        return NamedTensors.from_dict({
            key: ops.init(f.shape, f.dtype, key, init_type, meta_shape=f.meta_shape or None)
            for key, f in self.to_dict().items()})

    def init_zero(self) -> NamedTensors:
        """Zero tensors (`ops.init`) in the current graph, one per factory."""
        return self._init_type("zero")

    def init_undef(self) -> NamedTensors:
        """Undefined tensors (`ops.init`) in the current graph, one per factory."""
        return self._init_type("undef")

    @property
    def replica_groupings(self) -> NamedReplicaGrouping:
        return NamedReplicaGrouping.from_dict(
            {k: f.replica_grouping for k, f in self.to_dict().items()})


def add_variable_input(name: str, data_iter, dtype: Optional[popxl.dtype] = None,
                       by_ref: bool = False,
                       replica_grouping: Optional[popxl.ReplicaGrouping] = None
                       ) -> Tuple[popxl.Tensor, VariableFactory]:
    """A factory and its graph input in the current graph."""
    vf = VariableFactory(data_iter, dtype, name, by_ref, replica_grouping)
    return vf.create_input(), vf


def add_replica_sharded_variable_input(name: str, data_iter, dtype: Optional[popxl.dtype] = None,
                                       by_ref: bool = False,
                                       replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                                       shard_over: Optional[int] = None
                                       ) -> Tuple[popxl.Tensor, VariableFactory]:
    """Like `add_variable_input` but the input is a flat replica shard of the data."""
    rg = replica_grouping or popxl.gcg().ir.replica_grouping()
    shard_over = rg.group_size if shard_over is None else shard_over
    vf = VariableFactory(data_iter, dtype, name, by_ref, rg, shard_over)
    return vf.create_input(), vf
