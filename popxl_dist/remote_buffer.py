"""Remote buffers and remote / replica-sharded (RTS) variables.

Every replica owns its own copy of each buffer: `entries` slots of `tensor_shape` in the memory of
the worker that holds the replica. A remote variable lives in one entry of a buffer (the
entry holds its elements, in the buffer's shape); an RTS variable is stored as one shard per
replica (`shard_over` shards per variable group, the data flattened, zero-padded to
`shard_over * ceil(n / shard_over)` and cut into contiguous chunks: member i of a variable
group holds shard `i % shard_over`, in its entry's shape). A variable with a non-constant
grouping is sharded over the groups of its `const_rg`, as upstream stores it.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import dtypes
from ._ir.records import TensorKind
from .context import _execution_context, gcg
from .tensor import (HostTensor, Tensor, Variable, _host_array, _new_tensor,
                     _unshare_memmap_of_non_const_grouping)

__all__ = ["RemoteBuffer", "remote_buffer", "remote_variable", "remote_replica_sharded_variable",
           "replica_sharded_variable", "replica_sharded_buffer", "check_variables_fit_buffers"]


def _check_entries(entries) -> None:
    if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
        raise ValueError(f"Entries must be a non-zero, positive integer. Got {entries}")


class RemoteBuffer:
    """`entries` slots of `tensor_shape` / `tensor_dtype` per replica, in streaming memory.

    Must be created inside a graph context (it belongs to the current Ir).
    """

    def __init__(self, tensor_shape: Tuple[int, ...], tensor_dtype: dtypes.dtype, entries: int):
        _check_entries(entries)
        ir = gcg().ir
        data = ir._data
        self._ir = ir
        self._id = data.next_remote_buffer_id
        data.remote_buffers[self._id] = {"shape": (), "dtype": None, "entries": 1,
                                         "meta_shape": ()}
        try:
            self.set_remote_buffer_info(tensor_dtype, tensor_shape, entries)
        except Exception:
            del data.remote_buffers[self._id]
            raise
        data.next_remote_buffer_id += 1

    @property
    def _record(self) -> Dict[str, Any]:
        return self._ir._data.remote_buffers[self._id]

    @property
    def _current_ir(self):
        """The Ir the buffer belongs to."""
        return self._ir

    def set_remote_buffer_info(self, tensor_dtype: dtypes.dtype, tensor_shape: Tuple[int, ...],
                               entries: int) -> None:
        """Change the buffer's dtype, shape and number of entries (before a Session exists)."""
        _check_entries(entries)
        shape = tuple(int(d) for d in tensor_shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"RemoteBuffer: tensor_shape must be non-negative, got {shape}")
        self._check_mutable("its info")
        self._record.update(shape=shape, dtype=dtypes.dtype.as_dtype(tensor_dtype),
                            entries=entries)

    @property
    def remote_buffer_id(self) -> int:
        return self._id

    @property
    def tensor_shape(self) -> Tuple[int, ...]:
        return self._record["shape"]

    @property
    def tensor_dtype(self) -> dtypes.dtype:
        return self._record["dtype"]

    @property
    def entries(self) -> int:
        return self._record["entries"]

    @entries.setter
    def entries(self, value: int) -> None:
        _check_entries(value)
        self._check_mutable("entries")
        self._record["entries"] = value

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        return self._record["meta_shape"]

    @meta_shape.setter
    def meta_shape(self, shape: Tuple[int, ...]) -> None:
        self._check_mutable("meta_shape")
        self._record["meta_shape"] = tuple(int(d) for d in shape)

    def _check_mutable(self, what: str) -> None:
        if getattr(self._ir, "_prepared", False):
            raise ValueError(f"RemoteBuffer {self._id}: cannot change {what} after a Session was "
                             f"created for its Ir")

    def validate_tensor_matches_buffer(self, t: Tensor, num_shards: int = 1) -> None:
        """Raise ValueError unless `t` has the buffer's shape (or, for `num_shards` > 1, its
        sharded shape) and dtype."""
        shape = self.tensor_shape
        if num_shards > 1:
            shape = (math.ceil(int(np.prod(shape)) / num_shards),)
        if tuple(t.shape) != tuple(shape) or t.dtype != self.tensor_dtype:
            raise ValueError(f"Tensor {t.id} does not match buffer.\nExisting remote buffer "
                             f"{self._id} has shape={tuple(shape)} and dtype="
                             f"{self.tensor_dtype.name}.\nThe tensor has shape={tuple(t.shape)}, "
                             f"dtype={t.dtype.name}.")

    def __hash__(self) -> int:
        return hash((id(self._ir), self._id))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RemoteBuffer) and other._ir is self._ir
                and other._id == self._id)

    def __repr__(self) -> str:
        return (f"RemoteBuffer(id={self._id}, tensor_shape={self.tensor_shape}, "
                f"tensor_dtype={self.tensor_dtype.name}, entries={self.entries}"
                + (f", meta_shape={self.meta_shape}" if self.meta_shape else "") + ")")


def remote_buffer(tensor_shape: Tuple[int, ...], tensor_dtype: dtypes.dtype,
                  entries: int = 1) -> RemoteBuffer:
    """A new remote buffer of the current Ir."""
    return RemoteBuffer(tensor_shape, tensor_dtype, entries)


# --- variables -----------------------------------------------------------------------------
def _check_buffer(buf: Any, what: str) -> RemoteBuffer:
    if not isinstance(buf, RemoteBuffer):
        raise TypeError(f"{what}: remote_buffer must be a popxl.RemoteBuffer, got "
                        f"{type(buf).__name__}")
    if buf._ir is not gcg().ir:
        raise ValueError(f"{what}: remote buffer {buf.remote_buffer_id} belongs to another Ir")
    return buf


def _group_data(arr: np.ndarray, rg, name: str, what: str) -> Tuple[int, ...]:
    """The per-group shape of variable data (with a leading group axis for G > 1 groups)."""
    if rg is not None and rg.num_groups > 1:
        if arr.ndim == 0 or arr.shape[0] != rg.num_groups:
            raise ValueError(f"{what} '{name}': with a replica grouping of {rg.num_groups} "
                             f"groups the data needs a leading group axis of size "
                             f"{rg.num_groups}, got shape {arr.shape}")
        return tuple(arr.shape[1:])
    return tuple(arr.shape)


def _new_variable(what: str, data, dtype, name, downcast, replica_grouping, retrieval_mode,
                  shape_of, extra: Dict[str, Any], meta_shape=(), log2_scale=None,
                  nan_on_overflow=None) -> Variable:
    g = gcg()
    if g is not g.ir.main_graph:
        raise ValueError(f"{what}: variables can only be created in the main graph, the "
                         f"current graph is '{g.id}'")
    arr, d = _host_array(data, dtype, downcast, what, log2_scale, nan_on_overflow)
    rg = replica_grouping
    if rg is not None and rg._ir is not g.ir:
        raise ValueError(f"{what}: the replica grouping belongs to another Ir")
    mode = retrieval_mode or "one_per_group"
    if mode not in ("one_per_group", "all_replicas"):
        raise ValueError(f"{what}: retrieval_mode must be 'one_per_group' or 'all_replicas', "
                         f"got {mode!r}")
    arr = _unshare_memmap_of_non_const_grouping(arr, rg, name)
    shape = _group_data(arr, rg, name or "t", what)
    shape_of(shape, d)
    info = _new_tensor(g, name, shape, d, TensorKind.VARIABLE,
                       meta_shape=meta_shape if meta_shape else (), data=arr,
                       extra={"replica_grouping": rg, "retrieval_mode": mode, **extra})
    return g._tensor(info.id)


def _check_offset(buf: RemoteBuffer, offset: int, what: str) -> int:
    if not isinstance(offset, (int, np.integer)) or not 0 <= int(offset) < buf.entries:
        raise ValueError(f"{what}: offset must be an int in [0, {buf.entries}) for remote "
                         f"buffer {buf.remote_buffer_id} with {buf.entries} entries, got "
                         f"{offset!r}")
    return int(offset)


def remote_variable(data: HostTensor, remote_buffer: RemoteBuffer, offset: int = 0,
                    dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
                    downcast: bool = True, replica_grouping=None,
                    retrieval_mode: Optional[str] = "one_per_group", log2_scale=None,
                    nan_on_overflow=None) -> Variable:
    """A variable whose home is entry `offset` of `remote_buffer` (bring it on chip with
    `ops.remote_load`). With G > 1 groups, `data` has a leading group axis.

    As upstream, the data is not checked against the buffer here: an entry holds the
    variable's elements, so per-group data of another shape with the buffer's element count
    (e.g. `(1, 1)` data in a `(1,)` buffer) is laid out in the entry's shape. A variable whose
    element count or dtype does not fit its buffer is refused when a Session is created."""
    buf = _check_buffer(remote_buffer, "remote_variable")
    off = _check_offset(buf, offset, "remote_variable")
    return _new_variable("remote_variable", data, dtype, name, downcast, replica_grouping,
                         retrieval_mode, lambda shape, dt: None,
                         {"remote": (buf.remote_buffer_id, off)},
                         log2_scale=log2_scale, nan_on_overflow=nan_on_overflow)


def _shard_over(rg, shard_over: Optional[int], ir, what: str) -> int:
    group_size = rg.group_size if rg is not None else ir.replication_factor
    k = group_size if shard_over is None else shard_over
    if not isinstance(k, (int, np.integer)) or k < 1 or k > group_size or group_size % k:
        raise ValueError(f"{what}: shard_over must divide the replica group size "
                         f"{group_size} (and be at most that), got {shard_over!r}")
    return int(k)


def replica_sharded_buffer(shape: Tuple[int, ...], dtype: dtypes.dtype, replica_grouping=None,
                           shard_over: Optional[int] = None, entries: int = 1) -> RemoteBuffer:
    """A buffer for RTS variables of full `shape` (with the group axis first when the grouping
    has several groups): each entry holds one 1-D shard per replica."""
    ir = gcg().ir
    rg = replica_grouping
    if rg is not None and not rg.is_const:
        rg = rg.const_rg
    k = _shard_over(rg, shard_over, ir, "replica_sharded_buffer")
    shape = tuple(int(d) for d in shape)
    per_group = shape[1:] if rg is not None and rg.num_groups > 1 else shape
    n = int(np.prod(per_group, dtype=np.int64))
    buf = RemoteBuffer((math.ceil(n / k),), dtype, entries)
    buf.meta_shape = per_group
    # The shard length alone does not determine k (e.g. 3 elements over 4 or over 3 replicas
    # both give shards of 1), so remote_replica_sharded_variable reads it from here.
    buf._record["shard_over"] = k
    return buf


def remote_replica_sharded_variable(data: HostTensor, remote_buffer: RemoteBuffer,
                                    offset: int = 0, dtype: Optional[dtypes.dtype] = None,
                                    name: Optional[str] = None, downcast: bool = True,
                                    replica_grouping=None,
                                    retrieval_mode: Optional[str] = "one_per_group",
                                    log2_scale=None, nan_on_overflow=None) -> Variable:
    """An RTS variable stored in entry `offset` of `remote_buffer`: one shard per replica.
    Its `.shape` is the full (unsharded) per-group shape."""
    what = "remote_replica_sharded_variable"
    ir = gcg().ir
    if ir.replication_factor <= 1:
        raise ValueError(f"{what}: replicated tensor sharding needs a replication factor > 1, "
                         f"the Ir has {ir.replication_factor}")
    buf = _check_buffer(remote_buffer, what)
    off = _check_offset(buf, offset, what)
    info: Dict[str, Any] = {}

    def check(shape, dt):
        if buf.meta_shape and tuple(buf.meta_shape) != shape:
            raise ValueError(f"{what} '{name or 't'}': data of per-group shape {shape} does not "
                             f"match the meta_shape {buf.meta_shape} of remote buffer "
                             f"{buf.remote_buffer_id}")
        if not buf.meta_shape:
            buf.meta_shape = shape
        info["k"] = _shards_in_buffer(buf, shape, replica_grouping, ir)
        info["shape"] = shape

    holder: Dict[str, Any] = {"remote": (buf.remote_buffer_id, off), "sharded": True}
    var = _new_variable(what, data, dtype, name, downcast, replica_grouping, retrieval_mode,
                        check, holder, log2_scale=log2_scale, nan_on_overflow=nan_on_overflow)
    var._info.extra["shard_over"] = info["k"]
    var._info.meta_shape = tuple(info["shape"])
    return var


def _shards_in_buffer(buf: RemoteBuffer, shape: Tuple[int, ...], rg, ir) -> Optional[int]:
    """How many replicas share an RTS variable of per-group `shape` whose entry in `buf` holds
    one replica's shard (of the buffer's element count, whatever its shape): the count
    `replica_sharded_buffer` recorded, else the largest divisor of the sharding group's size
    (the group of `rg.const_rg`, as upstream stores the variable) that gives shards of that
    length. None when no count fits (refused when a Session is created)."""
    n = int(np.prod(shape, dtype=np.int64))
    length = int(np.prod(buf.tensor_shape, dtype=np.int64))
    group_size = rg.const_rg.group_size if rg is not None else ir.replication_factor
    k = buf._record.get("shard_over")
    if k is not None:
        return k if math.ceil(n / k) == length and group_size % k == 0 else None
    fits = [d for d in range(group_size, 0, -1)
            if group_size % d == 0 and math.ceil(n / d) == length]
    return fits[0] if fits else None


def replica_sharded_variable(data: HostTensor, dtype: Optional[dtypes.dtype] = None,
                             name: Optional[str] = None, downcast: bool = True,
                             replica_grouping=None, shard_over: Optional[int] = None,
                             retrieval_mode: Optional[str] = "one_per_group", log2_scale=None,
                             nan_on_overflow=None) -> Tuple[Variable, Tensor]:
    """An RTS variable and its on-device shard: the shard is loaded from the variable's buffer
    in the WeightsFromHost fragment, stored back in WeightsToHost, and persists across runs.
    Returns `(variable, shard)`."""
    from . import ops

    g = gcg()
    if g is not g.ir.main_graph:
        raise ValueError("replica_sharded_variable: variables can only be created in the main "
                         f"graph, the current graph is '{g.id}'")
    arr, d = _host_array(data, dtype, downcast, "replica_sharded_variable", log2_scale,
                         nan_on_overflow)
    buf = replica_sharded_buffer(arr.shape, d, replica_grouping, shard_over)
    var = remote_replica_sharded_variable(dtypes.host_view(arr, d), buf, 0,
                                          d if d in dtypes.FLOAT8_DTYPES else None,
                                          name, downcast, replica_grouping, retrieval_mode)
    with _execution_context("WeightsFromHostFragment"):
        shard = ops.remote_load(buf, 0, f"{name or var.name}_rts")
    with _execution_context("WeightsToHostFragment"):
        ops.remote_store(buf, 0, shard)
    return var, shard


# --- when a Session is created ----------------------------------------------------------
def check_variables_fit_buffers(ir_data) -> None:
    """Refuse remote and RTS variables that do not fit the remote buffer entry they live in
    (upstream checks nothing when they are created): a remote variable's per-group data needs
    the buffer's element count and dtype; an RTS variable's shard (its elements cut into the
    shards of its sharding group) needs the buffer's element count and dtype."""
    for tid, info in ir_data.main.tensors.items():
        home = info.extra.get("remote") if info.extra else None
        if home is None:
            continue
        buf = ir_data.remote_buffers[home[0]]
        entry = int(np.prod(buf["shape"], dtype=np.int64))
        where = f"remote buffer {home[0]} (shape {tuple(buf['shape'])}, dtype {buf['dtype'].name})"
        if info.dtype != buf["dtype"]:
            raise ValueError(f"Session: variable '{tid}' of dtype {info.dtype.name} does not fit "
                             f"{where}")
        if not info.extra.get("sharded"):
            if info.nelms != entry:
                raise ValueError(f"Session: remote variable '{tid}' of per-group shape "
                                 f"{info.shape} ({info.nelms} elements) does not fit {where}: an "
                                 f"entry holds {entry} elements")
        elif info.extra.get("shard_over") is None:
            rg = info.extra.get("replica_grouping")
            size = rg.const_rg.group_size if rg is not None else ir_data.replication_factor
            raise ValueError(f"Session: replica-sharded variable '{tid}' of per-group shape "
                             f"{info.shape} ({info.nelms} elements) cannot be cut over any "
                             f"divisor of its sharding group of {size} replicas into shards "
                             f"of the {entry} elements an entry of {where} holds")
