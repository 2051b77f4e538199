"""Public tensors: `Tensor`, `Variable`, `Constant`, `TensorSpec`, `TensorByRef` and their factories."""
from __future__ import annotations

import collections.abc
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, Optional, Tuple, Union

import numpy as np
from popart import getLogger

from . import dtypes
from ._ir.records import TensorInfo, TensorKind
from .context import gcg
from .errors import UndefinedValue
from .tensorlocation import TileSet
from .utils import check_memmap, to_numpy

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir
    from .replica_grouping import ReplicaGrouping

__all__ = ["Tensor", "Variable", "Constant", "TensorSpec", "TensorByRef", "graph_input",
           "graph_output", "variable", "constant", "remote_variable",
           "remote_replica_sharded_variable", "replica_sharded_variable",
           "replica_sharded_buffer", "HostTensor", "HostScalarTensor", "ScalarType",
           "TensorLike", "host_tensor_types", "TILE_SET_MAP"]

ScalarType = Union[int, float, bool]
# Upstream adds `torch.Tensor` when torch is installed; importing torch here would cost every
# `import popxl` seconds, so torch tensors are recognised by duck typing instead (`to_numpy`).
HostTensor = Union[np.ndarray, Iterable]
host_tensor_types = (np.ndarray, collections.abc.Iterable)
HostScalarTensor = Union[ScalarType, HostTensor]
TILE_SET_MAP = {TileSet.Compute: "compute", TileSet.IO: "io", TileSet.Undefined: "undefined"}


def check_shape(shape: Any, what: str) -> Tuple[int, ...]:
    """`shape` as a tuple of ints: a tuple or list of non-negative ints (NumPy ints too);
    TypeError for anything else (a bare int, None, floats), ValueError for negative sizes."""
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_))
            for s in shape):
        raise TypeError(f"{what}: shape must be a tuple or list of ints, got {shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{what}: shape must not have negative sizes, got {tuple(shape)}")
    return tuple(int(s) for s in shape)


class TensorSpec(collections.abc.Mapping):
    """Shape, dtype and meta_shape of a tensor, without a tensor."""

    def __init__(self, shape: Tuple[int, ...], dtype: dtypes.dtype, meta_shape: Tuple[int, ...] = ()):
        self._d = {"shape": check_shape(shape, "TensorSpec"),
                   "dtype": dtypes.dtype.as_dtype(dtype),
                   "meta_shape": check_shape(tuple(meta_shape or ()), "TensorSpec meta_shape")}

    shape = property(lambda self: self._d["shape"])
    dtype = property(lambda self: self._d["dtype"])
    meta_shape = property(lambda self: self._d["meta_shape"])

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return 3

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._d)

    def to_tuple(self) -> Tuple[Any, ...]:
        return (self.shape, self.dtype, self.meta_shape)

    def __hash__(self) -> int:
        return hash(self.to_tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorSpec) and self.to_tuple() == other.to_tuple()

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype}, meta_shape={self.meta_shape})"


class TensorByRef:
    """Annotation marking a `create_graph` parameter as a by-reference input."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("TensorByRef is an annotation only; it cannot be instantiated")


def _ops():
    from . import ops

    return ops


class Tensor:
    """A tensor of a graph. Instances come from ops, `graph_input`, `variable` and `constant`."""

    __array_ufunc__ = None  # make NumPy defer to our reflected operators
    __iter__ = None
    __contains__ = None
    # tensor type ("Variable", "Const", ...) -> the Tensor subclass graphs wrap such tensors in
    _tensor_types: Dict[str, type] = {}

    def __init__(self) -> None:
        raise RuntimeError("popxl.Tensor cannot be constructed directly. Use popxl ops, "
                           "popxl.variable, popxl.constant or popxl.graph_input.")

    def __init_subclass__(cls, tensor_type: Optional[str] = None, **kwargs: Any) -> None:
        """Register `cls` as the class of tensors of `tensor_type` (as upstream)."""
        super().__init_subclass__(**kwargs)
        if tensor_type is not None:
            Tensor._tensor_types[tensor_type] = cls

    @classmethod
    def _from_pb_tensor(cls, pb_tensor) -> "Tensor":
        """The popxl Tensor of a `_pb_tensor` view."""
        return pb_tensor._graph._tensor(pb_tensor.id)

    @property
    def _pb_tensor(self):
        from ._pb_shim import PbTensor

        return PbTensor(self._graph, self.id)

    @classmethod
    def _create(cls, graph: "Graph", info: TensorInfo) -> "Tensor":
        t = object.__new__(cls)
        t._graph = graph
        t._info = info
        return t

    # --- attributes -------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._info.id

    @property
    def name(self) -> str:
        gid = self._graph.id
        return self._info.id[len(gid) + 1:] if gid and self._info.id.startswith(gid + "/") \
            else self._info.id

    @property
    def scope(self) -> str:
        return self._graph.id

    dtype = property(lambda self: self._info.dtype)
    shape = property(lambda self: self._info.shape)
    rank = property(lambda self: len(self._info.shape))
    nelms = property(lambda self: self._info.nelms)

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        return self._info.meta_shape

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype, self.meta_shape)

    @property
    def ir(self) -> "Ir":
        return self._graph.ir

    @property
    def ipu(self) -> int:
        """The IPU the tensor is on; `UndefinedValue` if nothing places it (see `_placement`)."""
        ipu, _ = self._get_ipu_and_tile_set(raise_on_undefined_tile_set=False)
        return ipu

    @property
    def tile_set(self) -> str:
        """"compute" or "io"; `UndefinedValue` if nothing places the tensor."""
        _, tile_set = self._get_ipu_and_tile_set(raise_on_undefined_ipu=False)
        return tile_set

    def _placement(self, consumers: bool = True) -> Tuple[Optional[int], str]:
        """(ipu, tile set) as upstream derives them: the producer's (an IPU copy's destination,
        an output a multi-IPU op placed: its own IPU); else, for a graph input, the op calling
        the graph; else the first op consuming it (an IPU copy: its source); (None,
        "undefined") when nothing places it. `consumers=False` skips the two searches (the op
        builders' checks, which treat an unplaced tensor as matching any)."""
        gd = self._graph._data
        op = gd.producer.get(self.id)
        if op is not None:
            return self._info.extra.get("ipu", op.ipu), op.tile_set
        if "ipu" in self._info.extra:
            return self._info.extra["ipu"], "compute"
        if consumers:
            if self.id in gd.inputs:
                for pgd in self._graph.ir._data.graphs.values():
                    for o in pgd.ops:
                        if gd.id in o.called:
                            return o.ipu, o.tile_set
            for o in gd.ops:
                if self.id in o.inputs:
                    return (o.attrs["source"] if o.type == "IpuCopy" else o.ipu), o.tile_set
        return None, "undefined"

    def _get_ipu_and_tile_set(self, raise_on_undefined_tile_set: bool = True,
                              raise_on_undefined_ipu: bool = True) -> Tuple[int, str]:
        """(ipu, tile set) of this tensor (-1 for an undefined IPU); raises `UndefinedValue`
        where undefined (as asked)."""
        ipu, tile_set = self._placement()
        if raise_on_undefined_tile_set and tile_set == "undefined":
            raise UndefinedValue("Tensor's tile set is undefined.")
        if raise_on_undefined_ipu and ipu is None:
            raise UndefinedValue("Tensor's IPU is undefined.")
        return (-1 if ipu is None else ipu), tile_set

    @property
    def in_sync_with_ipu(self) -> bool:
        return True

    @property
    def location_info(self):
        return self._info.extra.get("location")

    def strides(self, shape=None) -> Tuple[int, ...]:
        shape = tuple(self.shape if shape is None else shape)
        item = self.dtype.as_numpy().itemsize
        out, acc = [], item
        for s in reversed(shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    # --- methods ----------------------------------------------------------------------
    def transpose(self, permutation=None) -> "Tensor":
        return _ops().transpose(self, permutation)

    def transpose_(self, permutation=None) -> "Tensor":
        return _ops().transpose_(self, permutation)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    @property
    def T_(self) -> "Tensor":
        return self.transpose_()

    def reshape(self, shape) -> "Tensor":
        return _ops().reshape(self, shape)

    def reshape_(self, shape) -> "Tensor":
        return _ops().reshape_(self, shape)

    def flatten(self) -> "Tensor":
        return _ops().flatten(self)

    def flatten_(self) -> "Tensor":
        return _ops().flatten_(self)

    def detach(self) -> "Tensor":
        return _ops().detach(self)

    def detach_(self) -> "Tensor":
        return _ops().detach_(self)

    def diag(self) -> "Tensor":
        if self.rank != 2:
            raise ValueError(f"Diag expected a 2d tensor. ('{self.id}' has shape {self.shape})")
        return self.flatten()[:: self.shape[1] + 1]

    def copy_to_ipu(self, destination: int, source: Optional[int] = None) -> "Tensor":
        return _ops().ipu_copy(self, destination, source)

    # --- operators --------------------------------------------------------------------
    def _ensure_tensor(self, value: Any, dtype: Optional[dtypes.dtype] = None,
                       raise_on_empty: bool = True) -> "Tensor":
        """`value` if it is a Tensor, else a constant of `dtype` (default: this tensor's)."""
        if isinstance(value, Tensor):
            return value
        if raise_on_empty and isinstance(value, (np.ndarray, list, tuple)) and \
                np.size(value) == 0:
            raise ValueError(f"The value passed to an operator on tensor '{self.id}' is empty; "
                             f"an empty host value cannot become a constant")
        return constant(value, self.dtype if dtype is None else dtype)

    def __add__(self, other):
        return _ops().add(self, self._ensure_tensor(other))

    def __radd__(self, other):
        return _ops().add(self._ensure_tensor(other), self)

    def __iadd__(self, other):
        _ops().add_(self, self._ensure_tensor(other))
        return self

    def __sub__(self, other):
        return _ops().sub(self, self._ensure_tensor(other))

    def __rsub__(self, other):
        return _ops().sub(self._ensure_tensor(other), self)

    def __mul__(self, other):
        return _ops().mul(self, self._ensure_tensor(other))

    def __rmul__(self, other):
        return _ops().mul(self._ensure_tensor(other), self)

    def __truediv__(self, other):
        return _ops().div(self, self._ensure_tensor(other))

    def __rtruediv__(self, other):
        return _ops().div(self._ensure_tensor(other), self)

    def __mod__(self, other):
        return _ops().fmod(self, self._ensure_tensor(other))

    def __rmod__(self, other):
        return _ops().fmod(self._ensure_tensor(other), self)

    def __pow__(self, other):
        # Deviation from upstream (documented quirk): a Python exponent takes self's dtype so
        # that `x ** 2` works on float tensors.
        return _ops().pow(self, self._ensure_tensor(other))

    def __rpow__(self, other):
        return _ops().pow(self._ensure_tensor(other), self)

    def __neg__(self):
        return _ops().negate(self)

    def __matmul__(self, other):
        return _ops().matmul(self, self._ensure_tensor(other))

    def __rmatmul__(self, other):
        return _ops().matmul(self._ensure_tensor(other), self)

    def __and__(self, other):
        return _ops().logical_and(self, self._ensure_tensor(other))

    def __rand__(self, other):
        return _ops().logical_and(self._ensure_tensor(other), self)

    def __or__(self, other):
        return _ops().logical_or(self, self._ensure_tensor(other))

    def __ror__(self, other):
        return _ops().logical_or(self._ensure_tensor(other), self)

    def __invert__(self):
        return _ops().logical_not(self)

    def __len__(self) -> int:
        if not self.shape:
            raise ValueError(f"Tensor is a scalar and doesn't have a length. ('{self.id}')")
        return self.shape[0]

    def __getitem__(self, key) -> "Tensor":
        from .ops.indexing import tensor_getitem

        return tensor_getitem(self, key)

    def __eq__(self, other: object) -> bool:  # identity, as upstream
        return isinstance(other, Tensor) and other._info is self._info

    def __hash__(self) -> int:
        return hash((self._info.id, id(self._graph.ir)))

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        # `Tensor[...]` for every class, as the seed documents print (SDK 3.0/3.1); upstream
        # 3.2+ names the class (`Variable[...]`).
        return f"Tensor[{self.id} {self.dtype} {self.shape}]"


class Variable(Tensor, tensor_type="Variable"):
    """A persistent main-graph tensor, one copy per replica (or per replica group)."""

    @property
    def replica_grouping(self) -> "ReplicaGrouping":
        rg = self._info.extra.get("replica_grouping")
        return rg if rg is not None else self.ir.replica_grouping()

    @property
    def retrieval_mode(self) -> str:
        return self._info.extra.get("retrieval_mode", "one_per_group")

    @property
    def shape_on_host(self) -> Tuple[int, ...]:
        """The variable's shape on the host: an outer dimension of one value per replica group
        when there are several groups (upstream's; whatever the retrieval mode)."""
        rg = self.replica_grouping
        if rg.num_groups > 1:
            return (rg.num_groups, *self._full_shape)
        return self._full_shape

    @property
    def _retrieved_shape(self) -> Tuple[int, ...]:
        """The shape of `Session.get_tensor_data`'s result: one value per replica for
        "all_replicas" retrieval of groups of several replicas, else `shape_on_host`."""
        rg = self.replica_grouping
        if self.retrieval_mode == "all_replicas" and rg.group_size > 1:
            return (self.ir.replication_factor, *self._full_shape)
        return self.shape_on_host

    @property
    def shape_on_replica(self) -> Tuple[int, ...]:
        return self.shape

    @property
    def _full_shape(self) -> Tuple[int, ...]:
        return self.meta_shape if self._info.extra.get("sharded") else self.shape

    @property
    def _memmap_arr(self) -> Optional[np.memmap]:
        """The `np.memmap` this variable was created from (its host data, shared), or None."""
        data = self._info.data
        return dtypes.host_view(data, self.dtype) if isinstance(data, np.memmap) else None

    def _flush_data_if_memmap(self) -> None:
        """Write a memmap-backed variable's host data through to its file."""
        mm = self._memmap_arr
        if mm is not None and mm.flags.writeable:
            mm.flush()

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:
        return _ops().ipu_copy(self, dst, src)


class Constant(Tensor, tensor_type="Const"):
    """A tensor whose value is folded into the program."""

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:
        return _ops().ipu_copy(self, dst, src)


TensorLike = Union[Tensor, HostTensor]


def _wrap(graph: "Graph", info: TensorInfo) -> Tensor:
    return graph._tensor(info.id)


def _new_tensor(graph: "Graph", name: Optional[str], shape, dtype, kind: str,
                meta_shape=(), data=None, extra=None) -> TensorInfo:
    graph.ir._check_not_frozen(f"{kind} tensor '{name or 't'}'")
    shape = check_shape(shape, f"{kind} tensor '{name or 't'}'")
    gd = graph._data
    tid = graph.ir._data.unique_tensor_id(gd, graph._scoped_tensor_id(name or "t"))
    info = TensorInfo(tid, tuple(shape), dtype, kind, tuple(meta_shape or ()), data, extra)
    gd.tensors[tid] = info
    return info


def graph_input(shape, dtype: dtypes.dtype, name: Optional[str] = None, by_ref: bool = False,
                meta_shape=None) -> Tensor:
    """Add an input to the current graph and return it."""
    g = gcg()
    info = _new_tensor(g, name, shape, dtypes.dtype.as_dtype(dtype), TensorKind.INPUT,
                       meta_shape or ())
    g._data.inputs.append(info.id)
    if by_ref:
        g._data.by_ref_inputs.add(info.id)
    return g._tensor(info.id)


def graph_output(t: Tensor) -> None:
    """Mark `t` as the next output of the current graph."""
    g = gcg()
    if not isinstance(t, Tensor):
        raise TypeError(f"graph_output: expected a popxl.Tensor, got {type(t).__name__}")
    if t._graph is not g:
        raise ValueError(f"graph_output: tensor '{t.id}' is not in the current graph '{g.id}'")
    g._data.outputs.append(t.id)


def _host_array(data, dtype, downcast, what: str, log2_scale=None,
                nan_on_overflow=None) -> Tuple[np.ndarray, dtypes.dtype]:
    """(host array, popxl dtype) of factory `data`. float8 data (structured dtypes, as the user
    gives and gets it) is stored as a uint8 view of its codes: what the engine computes on."""
    if isinstance(data, Tensor):
        raise TypeError(f"{what}: `data` must be host data (NumPy, Python, torch), got {data!r}")
    d = dtypes.dtype.as_dtype(dtype) if dtype is not None else None
    if isinstance(data, np.memmap):
        check_memmap(data, d)         # upstream's messages, as they are
    try:
        arr = to_numpy(data, d, downcast=downcast, log2_scale=log2_scale,
                       nan_on_overflow=nan_on_overflow)
    except (RuntimeError, ValueError, TypeError) as e:
        raise type(e)(f"{what}: {e}") from None
    if isinstance(arr, np.memmap) and not arr.flags.writeable and what != "constant":
        gcg().ir._has_read_only_memmap = True
    d = d if d is not None else dtypes.dtype.as_dtype(arr.dtype)  # raises on unsupported dtypes
    if d in dtypes.FLOAT8_DTYPES:
        arr = arr.view(np.uint8)      # (a memmap's view is a memmap of the same file)
    return arr, d


def _unshare_memmap_of_non_const_grouping(arr: np.ndarray, rg, name: Optional[str]
                                          ) -> np.ndarray:
    """As upstream, a variable with a non-constant replica grouping copies memmap data (its
    host layout is not the device's), so it is not memmap-backed: warn and copy."""
    if isinstance(arr, np.memmap) and rg is not None and not rg.is_const:
        getLogger().warn(      # PopART's logger, as upstream (stderr, not Python logging)
            f"In creation of variable {name or 't'}, you have passed np.memmap data and a "
            f"non-const replica grouping ({rg!r}), which requires a copy of the np.memmap data: "
            f"the variable is not backed by the memmap")
        return np.array(arr, copy=True)
    return arr


def variable(data: HostTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: bool = True, replica_grouping: Optional["ReplicaGrouping"] = None,
             retrieval_mode: Optional[str] = None, log2_scale=None,
             nan_on_overflow=None) -> Variable:
    """A variable in the main graph initialised with `data`.

    With a `replica_grouping` of G > 1 groups, `data` has shape `(G, *shape)`. For a float8
    `dtype`, float16/32/64 data is cast with `log2_scale` / `nan_on_overflow` and float8 data
    (`popxl.dtypes.np_dtype_float8_143/152`) is taken as it is (see `popxl.utils.to_numpy`);
    float8 data without `dtype` makes a float8 variable. An `np.memmap` of the
    variable's dtype is shared, not copied: it is the variable's host data
    (`Variable._memmap_arr`, what `Session.get_tensor_data` returns), and `weights_to_host`
    writes into it (a read-only memmap turns off `weights_to_host` on leaving the session).
    """
    g = gcg()
    if g is not g.ir.main_graph:
        raise ValueError(f"variable: variables can only be created in the main graph, the "
                         f"current graph is '{g.id}'")
    arr, d = _host_array(data, dtype, downcast, "variable", log2_scale, nan_on_overflow)
    rg = replica_grouping
    if rg is not None and rg._ir is not g.ir:
        raise ValueError("variable: the replica grouping belongs to another Ir")
    mode = retrieval_mode or "one_per_group"
    if mode not in ("one_per_group", "all_replicas"):
        raise ValueError(f"variable: retrieval_mode must be 'one_per_group' or 'all_replicas', "
                         f"got {mode!r}")
    arr = _unshare_memmap_of_non_const_grouping(arr, rg, name)
    shape = arr.shape
    if rg is not None and rg.num_groups > 1:
        if arr.ndim == 0 or arr.shape[0] != rg.num_groups:
            raise ValueError(
                f"variable '{name or 't'}': with a replica grouping of {rg.num_groups} groups the "
                f"data needs a leading group axis of size {rg.num_groups}, got shape {arr.shape}")
        shape = arr.shape[1:]
    info = _new_tensor(g, name, shape, d, TensorKind.VARIABLE,
                       data=arr, extra={"replica_grouping": rg, "retrieval_mode": mode})
    return g._tensor(info.id)


def constant(data: HostTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: bool = True, log2_scale=None, nan_on_overflow=None) -> Constant:
    """A constant in the current graph (float8: as `variable`)."""
    g = gcg()
    arr, d = _host_array(data, dtype, downcast, "constant", log2_scale, nan_on_overflow)
    arr.setflags(write=False)
    info = _new_tensor(g, name, arr.shape, d, TensorKind.CONSTANT, data=arr)
    return g._tensor(info.id)


_REMOTE_FACTORIES = ("remote_variable", "remote_replica_sharded_variable",
                     "replica_sharded_variable", "replica_sharded_buffer")


def __getattr__(name: str) -> Any:
    # Upstream defines the remote/RTS factories in this module; they live in remote_buffer.py
    # (which imports this module), so they are looked up on first use.
    if name in _REMOTE_FACTORIES:
        import importlib

        # (`popxl.remote_buffer` is the function of that name, not the module)
        return getattr(importlib.import_module(f"{__package__}.remote_buffer"), name)
    raise AttributeError(f"module 'popxl.tensor' has no attribute '{name}'")
