"""Remote buffer ops: `remote_load`, `remote_load_`, `remote_store`; `remote_code_load`
(`code_copy` always raises).

Each replica reads and writes its own copy of the buffer. An int offset becomes a uint32
constant; a Tensor offset picks the entry at run time (out-of-range entries raise).
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from popart._internal._types import CodeLocation

from .. import context, dtypes
from ..context import gcg
from ..graph import Graph
from ..remote_buffer import RemoteBuffer, _check_buffer
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_in_graph, check_tensor
from .host_io import init

__all__ = ["remote_load", "remote_load_", "remote_store", "remote_code_load"]

_OFFSET_DTYPES = (dtypes.int32, dtypes.uint32)


def multiply_tuple(tup) -> int:
    """The product of the entries of `tup` (the element count of a shape)."""
    n = 1
    for d in tup:
        n *= int(d)
    return n


def _offset(buf: RemoteBuffer, offset: Union[int, Tensor], opname: str) -> Tensor:
    if isinstance(offset, Tensor):
        check_in_graph(gcg(), offset, opname)
        if offset.dtype not in _OFFSET_DTYPES or offset.nelms != 1:
            raise TypeError(f"{opname}: offset tensor '{offset.id}' must be a scalar int32 or "
                            f"uint32, got shape {offset.shape} dtype {offset.dtype.name}")
        return offset
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"{opname}: offset must be an int or a Tensor, got "
                        f"{type(offset).__name__}")
    if not 0 <= offset < buf.entries:
        raise ValueError(f"{opname}: offset {offset} is outside remote buffer "
                         f"{buf.remote_buffer_id}'s {buf.entries} entries")
    return constant(offset, dtypes.uint32, "offset")


def remote_load(remote_buffer: RemoteBuffer, offset: Union[int, Tensor],
                name: Optional[str] = None) -> Tensor:
    """Load entry `offset` of this replica's copy of `remote_buffer` (output carries the
    buffer's meta_shape)."""
    buf = _check_buffer(remote_buffer, "remote_load")
    off = _offset(buf, offset, "remote_load")
    name = name or f"id_{buf.remote_buffer_id}_offset_{off.name}"
    t = init(buf.tensor_shape, buf.tensor_dtype, f"{name}_init", "undef")
    return add_op("RemoteLoad", "remote_load", [t, off],
                  [Out(f"{name}_remote_loaded", buf.tensor_shape, buf.tensor_dtype,
                       buf.meta_shape)],
                  {"buffer": buf.remote_buffer_id})[0]


def remote_load_(remote_buffer: RemoteBuffer, offset: Union[int, Tensor], t: Tensor) -> Tensor:
    """Load entry `offset` into `t` in place."""
    buf = _check_buffer(remote_buffer, "remote_load_")
    check_tensor(t, "remote_load_", "t")
    check_in_graph(gcg(), t, "remote_load_")
    buf.validate_tensor_matches_buffer(t)
    off = _offset(buf, offset, "remote_load_")
    return add_op("RemoteLoadInplace", "remote_load_", [t, off],
                  [Out(f"{t.name}_remote_loaded", t.shape, t.dtype,
                       buf.meta_shape or t.meta_shape)],
                  {"buffer": buf.remote_buffer_id})[0]


def remote_store(remote_buffer: RemoteBuffer, offset: Union[int, Tensor], t: Tensor) -> None:
    """Store `t` into entry `offset` of this replica's copy of `remote_buffer`."""
    buf = _check_buffer(remote_buffer, "remote_store")
    check_tensor(t, "remote_store", "t")
    check_in_graph(gcg(), t, "remote_store")
    buf.validate_tensor_matches_buffer(t)
    off = _offset(buf, offset, "remote_store")
    add_op("RemoteStore", "remote_store", [t, off], [], {"buffer": buf.remote_buffer_id})


CODE_LOCATION = Literal["executable", "compute_buffer", "io_buffer"]
TO_IR_ENUM_MAP = {"io_buffer": CodeLocation.Buffer, "compute_buffer": CodeLocation.Buffer,
                  "executable": CodeLocation.ExecutableMemory}


def remote_code_load(graph: Graph, destination: str) -> None:
    """Load `graph`'s code from streaming memory: a no-op in the emulator (all code is resident).

    Only `destination="executable"` is supported (as upstream; "compute_buffer" and
    "io_buffer" raise NotImplementedError); loading the current graph raises `ValueError`.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"remote_code_load: 'graph' must be a popxl.Graph, got "
                        f"{type(graph).__name__}")
    if destination not in TO_IR_ENUM_MAP:
        raise ValueError(f"Not a valid location: {destination}. Must choose from: "
                         f"{', '.join(TO_IR_ENUM_MAP)}")
    if destination != "executable":
        raise NotImplementedError(f"remote_code_load: destination {destination!r} is not "
                                  f"supported, only 'executable' (as upstream)")
    if graph is context.gcg() or graph.id == context.gcg().id:
        raise ValueError(f"The remote_code_load op cannot load the code for the graph it "
                         f"resides in ({graph.id or 'the main graph'}).")
    add_op("RemoteCodeLoad", "remote_code_load", [], [],
           {"graph": graph.id, "destination": destination})


def code_copy(graph: Graph, source: str, destination: str) -> None:
    """Copy a graph's code between memory locations: not implemented upstream either."""
    raise NotImplementedError("code_copy is not implemented (upstream raises too; use "
                              "remote_code_load)")
