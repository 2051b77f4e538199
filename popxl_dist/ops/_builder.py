"""What every op builder uses: argument checks and appending one Op to the current graph.

Builders never compute. They check arguments, infer shapes and dtypes, call `add_op`, and return
the output Tensors.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import dtypes
from .._ir.records import Op, TensorInfo, TensorKind
from .._pb_shim import op_view
from ..context import get_current_context, gcg
from ..errors import OpSetupError, OpSetupTypeError
from ..graph import Graph
from ..tensor import Tensor, constant

__all__ = ["Out", "add_op", "check_tensor", "check_in_graph", "check_same_dtype",
           "broadcast_shape", "normalize_axes", "as_tensor_like", "debug_location",
           "check_float_tensors", "check_no_float8", "FLOAT8_INPUT_OP_TYPES"]

_POPXL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_lib_dirs: Tuple[str, ...] = ()


def _library_dirs() -> Tuple[str, ...]:
    """The folders of popxl and popxl_addons as imported (their names differ between the source
    tree, an installed wheel and a folder of symlinks)."""
    global _lib_dirs
    if not _lib_dirs:
        dirs = [_POPXL_DIR]
        addons = sys.modules.get("popxl_addons")
        path = getattr(addons, "__file__", None)
        if path is None:
            spec = importlib.util.find_spec("popxl_addons")
            path = spec.origin if spec is not None else None
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
        _lib_dirs = tuple(dirs)
    return _lib_dirs


class Out(NamedTuple):
    """An output to create: name (before scoping), shape, dtype, optional meta_shape."""

    name: str
    shape: Tuple[int, ...]
    dtype: dtypes.dtype
    meta_shape: Tuple[int, ...] = ()


def debug_location() -> str:
    """`file:line` of the first stack frame outside popxl-dist (where the user built the op)."""
    f = sys._getframe(1)
    lib_dirs = _library_dirs()
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(lib_dirs) and "contextlib" not in fn:
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return ""


def check_tensor(t: Any, opname: str, argname: str) -> Tensor:
    """`t` if it is a Tensor, else upstream's TypeError (naming the op after it)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"The input `{argname}` is not a Tensor. Type: {type(t)}. Value: {t}. "
                        f"({opname}: argument '{argname}' must be a popxl.Tensor)")
    return t


def check_float_tensors(opname: str, floats: Sequence[dtypes.dtype], **tensors: Any) -> None:
    """Each keyword argument must be a Tensor whose dtype is one of `floats`."""
    for argname, t in tensors.items():
        check_tensor(t, opname, argname)
        if t.dtype not in floats:
            raise TypeError(f"{opname}: '{t.id}' must be "
                            f"{' or '.join(d.name for d in floats)}, got {t.dtype.name}")


def check_in_graph(g: Graph, t: Tensor, opname: str) -> None:
    if t._graph is not g:
        raise ValueError(
            f"The input tensor `{t.id}` is not in the current Graph '{g.id}' ({opname}). "
            f"Tensors of another graph must be passed in as graph inputs (popxl.graph_input or "
            f"a create_graph argument)")
    if g._data.tensors.get(t.id) is not t._info:
        raise ValueError(
            f"{opname}: tensor '{t.id}' no longer exists in graph '{g.id}': a transform (such "
            f"as pipelined_execution or repeat_graph) moved the ops that made it to another "
            f"graph")


def check_same_dtype(opname: str, *ts: Tensor) -> dtypes.dtype:
    d = ts[0].dtype
    for t in ts[1:]:
        if t.dtype != d:
            names = ", ".join(f"'{x.id}' {x.dtype.name}" for x in ts)
            raise OpSetupTypeError(f"{opname}: inputs must have the same dtype, got {names}")
    return d


def broadcast_shape(opname: str, *ts: Tensor) -> Tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(t.shape for t in ts)))
    except ValueError:
        names = ", ".join(f"'{t.id}' {t.shape}" for t in ts)
        raise OpSetupError(f"{opname}: shapes cannot be broadcast together: {names}") from None


def normalize_axes(opname: str, axis, rank: int) -> Tuple[int, ...]:
    """`axis` (None = all, int, or sequence, negatives allowed) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(rank))
    axes = [axis] if isinstance(axis, (int, np.integer)) else axis
    if (isinstance(axes, (str, bytes, np.ndarray)) or not isinstance(axes, Sequence)
            or not all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
                       for a in axes)):
        raise TypeError(f"{opname}: axis must be an int or a sequence of ints, got {axis!r}")
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"{opname}: axis {a} is out of range for rank {rank}")
        out.append(a % rank if rank else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"{opname}: repeated axis in {axis}")
    return tuple(sorted(out))


def as_tensor_like(x: Any, like: Tensor, opname: str, argname: str) -> Tensor:
    """A Tensor stays; host data becomes a constant of `like`'s dtype in the current graph."""
    if isinstance(x, Tensor):
        return x
    try:
        return constant(x, like.dtype)
    except Exception as e:  # noqa: BLE001 - re-raised with the op's name
        raise TypeError(f"{opname}: argument '{argname}' must be a Tensor or host data, "
                        f"got {x!r}") from e


# Op types that may read float8 tensors: data movement (float8 values are uint8 codes, which
# these copy exactly) and the float8 casts / pow2-scaled matmul and convolutions. The IPU has no
# float8 arithmetic; any other op given float8 inputs raises at build time.
FLOAT8_INPUT_OP_TYPES = frozenset({
    "Reshape", "ReshapeInplace", "Transpose", "TransposeInplace", "Slice", "SliceInplace",
    "Subsample", "Split", "Concat", "ConcatInplace", "Identity", "Detach", "DetachInplace",
    "IpuCopy", "IoTileCopy", "HostLoad", "HostStore", "RemoteLoad", "RemoteStore",
    "RemoteLoadInplace", "Call", "Loop", "If", "CopyVarUpdate", "DynamicSlice", "DynamicUpdate",
    "DynamicUpdateInplace", "Gather", "SliceGrad", "SubsampleGrad", "CastThenPow2Scale",
    "MatMul", "Conv", "ConvTranspose", "PrintTensor", "ReplicatedAllGather",
    "ReplicatedReduceScatter"})


def check_no_float8(op_type: str, settings_name: str, inputs: Sequence[Tensor]) -> None:
    """TypeError if an op type that computes gets float8 inputs."""
    if op_type in FLOAT8_INPUT_OP_TYPES:
        return
    bad = [t for t in inputs if t.dtype in dtypes.FLOAT8_DTYPES]
    if bad:
        names = ", ".join(f"'{t.id}' {t.dtype.name}" for t in bad)
        raise TypeError(f"{settings_name}: float8 inputs are not supported ({names}); float8 "
                        f"tensors are cast with pow2scale_cast_from_fp8, multiplied with "
                        f"matmul_pow2scaled / conv_pow2scaled, or moved and reshaped")


def add_op(op_type: str, settings_name: str, inputs: Sequence[Tensor], outputs: Sequence[Out],
           attrs: Optional[Dict[str, Any]] = None, called: Sequence[str] = (),
           graph: Optional[Graph] = None, out_ids: Optional[Sequence[str]] = None,
           notify: bool = True) -> List[Tensor]:
    """Append one op of `op_type` to the current graph and return its new output tensors.

    `out_ids` gives the outputs' exact tensor ids (made with `Graph._create_tensor_id`, as
    upstream's `createOpInGraph` callers do) instead of ids made from the `Out` names; with
    `notify=False` the op-created hooks are left to the caller (who calls `ctx._op_created`)."""
    g = graph if graph is not None else gcg()
    g.ir._check_not_frozen(f"{op_type} '{settings_name}'")
    for t in inputs:
        check_in_graph(g, t, settings_name)
    check_no_float8(op_type, settings_name, inputs)
    ctx = get_current_context()
    ir_data = g.ir._data
    gd = g._data
    wanted = list(out_ids) if out_ids is not None else None
    if wanted is not None:
        if len(wanted) != len(outputs):
            raise ValueError(f"{settings_name}: {len(wanted)} output ids given for "
                             f"{len(outputs)} outputs")
        for tid in wanted:
            if not isinstance(tid, str) or not tid or tid in gd.tensors or wanted.count(tid) > 1:
                raise ValueError(f"{settings_name}: output tensor id {tid!r} is not a new id "
                                 f"of graph '{g.id}' (make one with graph._create_tensor_id)")
    out_ids = []
    for i, o in enumerate(outputs):
        tid = (wanted[i] if wanted is not None
               else ir_data.unique_tensor_id(gd, g._scoped_tensor_id(o.name)))
        gd.tensors[tid] = TensorInfo(tid, o.shape, o.dtype, TensorKind.INTERMEDIATE,
                                     tuple(o.meta_shape or ()))
        out_ids.append(tid)
    op = Op(op_type, ir_data.new_op_id(), ctx.scoped_name(settings_name),
            tuple(t.id for t in inputs), tuple(out_ids), attrs or {}, tuple(called),
            ctx.ipu_id, ctx.tile_set, ctx.execution_context, debug_location())
    gd.add_op(op)
    if notify:
        ctx._op_created(op_view(g, op))
    return [g._tensor(t) for t in out_ids]


def meta_of(*ts: Tensor) -> Tuple[int, ...]:
    """Propagated meta_shape of element-wise inputs (RTS shards keep their full shape)."""
    metas = {t.meta_shape for t in ts if t.meta_shape}
    if len(metas) > 1:
        raise ValueError(f"Incompatible meta shapes: {sorted(metas)}")
    return metas.pop() if metas else ()
