"""Editing existing IR in place: what graph transforms need beyond the builders.

Builders only append new ops to the current graph. Transforms such as the addons' pipelining,
`repeat_graph` and `route_tensor_into_graph` also move ops between graphs, add inputs to graphs
(and to every site that calls them) after the fact, and ask which inputs an op writes. Upstream
popxl_addons does this through popart's `_pb_graph`; this module is popxl-dist's private
equivalent. It works on the plain IR records (`_ir.records`) plus the public `Graph` wrappers
(whose Tensor caches it keeps consistent). Programs do not call it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

from .records import GraphData, Op, TensorInfo, TensorKind

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["tensor_name", "new_tensor", "add_input", "clone_op", "remove_ops", "replace_uses",
           "consumers", "modified_inputs", "call_sites", "connect_input"]


def tensor_name(gd: GraphData, tid: str) -> str:
    """`tid` without its graph prefix (what `Tensor.name` returns)."""
    prefix = gd.id + "/"
    return tid[len(prefix):] if gd.id and tid.startswith(prefix) else tid


def new_tensor(graph: "Graph", like: TensorInfo, name: str,
               kind: str = TensorKind.INTERMEDIATE) -> str:
    """A new tensor in `graph` with `like`'s shape, dtype and meta_shape (and, for constants,
    its data), named `name` (made unique). Returns its id."""
    gd = graph._data
    wanted = f"{gd.id}/{name}" if gd.id else name
    tid = graph.ir._data.unique_tensor_id(gd, wanted)
    data = like.data if kind == TensorKind.CONSTANT else None
    gd.tensors[tid] = TensorInfo(tid, like.shape, like.dtype, kind, like.meta_shape, data)
    return tid


def add_input(graph: "Graph", like: TensorInfo, name: str, by_ref: bool = False) -> str:
    """Append an input shaped like `like` to `graph` (no name scope applied). Returns its id."""
    tid = new_tensor(graph, like, name, TensorKind.INPUT)
    graph._data.inputs.append(tid)
    if by_ref:
        graph._data.by_ref_inputs.add(tid)
    return tid


def clone_op(graph: "Graph", src: GraphData, op: Op, tensor_map: Dict[str, str]) -> Op:
    """Append a copy of `op` (an op of `src`) to `graph`.

    Each input id is translated through `tensor_map` (src id -> id in `graph`); the outputs become
    new tensors of `graph` named as in `src`, and are added to `tensor_map`. The copy gets a new
    IR-wide op id and keeps type, name, attributes, called graphs, placement and debug info.
    """
    gd = graph._data
    ins = []
    for t in op.inputs:
        if t not in tensor_map:
            raise KeyError(f"clone_op: input '{t}' of {op.describe()} has no counterpart in "
                           f"graph '{gd.id}'")
        ins.append(tensor_map[t])
    outs = []
    for t in op.outputs:
        new = new_tensor(graph, src.tensors[t], tensor_name(src, t))
        tensor_map[t] = new
        outs.append(new)
    copy = Op(op.type, graph.ir._data.new_op_id(), op.name, tuple(ins), tuple(outs),
              dict(op.attrs), op.called, op.ipu, op.tile_set, op.exec_ctx, op.debug)
    gd.add_op(copy)
    return copy


def remove_ops(graph: "Graph", ops: Iterable[Op]) -> None:
    """Remove `ops` and their output tensors from `graph` (outputs must be unused elsewhere)."""
    gd = graph._data
    doomed = list(ops)
    ids = {id(op) for op in doomed}
    gd.ops = [op for op in gd.ops if id(op) not in ids]
    for op in doomed:
        for t in op.outputs:
            if gd.producer.get(t) is op:
                del gd.producer[t]
            gd.tensors.pop(t, None)
            graph._wrappers.pop(t, None)


def replace_uses(gd: GraphData, old: str, new: str) -> None:
    """Make every op input and graph output that reads tensor `old` read `new` instead."""
    for op in gd.ops:
        if old in op.inputs:
            op.inputs = tuple(new if t == old else t for t in op.inputs)
    gd.outputs = [new if t == old else t for t in gd.outputs]


def consumers(gd: GraphData) -> Dict[str, List[Op]]:
    """{tensor id: ops reading it, in schedule order}."""
    out: Dict[str, List[Op]] = {}
    for op in gd.ops:
        for t in op.inputs:
            lst = out.setdefault(t, [])
            if not lst or lst[-1] is not op:
                lst.append(op)
    return out


def modified_inputs(graphs: Dict[str, GraphData], op: Op) -> Tuple[int, ...]:
    """Indices of the inputs `op` may write in place.

    In-place kernels report their own; a call or loop writes the inputs it marks modified and
    the by-ref inputs of its callee (conservatively: upstream knows the exact regions).
    """
    if op.type in ("Call", "Loop"):
        offset = 2 if op.type == "Loop" else 0
        callee = graphs[op.called[0]]
        mod = set(op.attrs.get("modified", ()))
        for gi, t in enumerate(callee.inputs):
            if t in callee.by_ref_inputs and gi >= offset:
                mod.add(gi - offset)
        return tuple(sorted(i for i in mod if i < len(op.inputs)))
    if op.type == "If":
        return ()
    from ..engine.kernels import load_all
    from ..engine.kernels.registry import spec_of

    load_all()
    spec = spec_of(op)
    if spec is None or not spec.modifies:
        return ()
    return spec.modified_inputs(op)


def call_sites(graphs: Dict[str, GraphData], gid: str) -> List[Tuple[GraphData, Op]]:
    """Every (parent graph, op) that calls graph `gid` (Call, Loop or If)."""
    return [(pgd, op) for pgd in graphs.values() for op in pgd.ops if gid in op.called]


def connect_input(graphs: Dict[str, GraphData], op: Op, parent_tid: str, sub_tid: str,
                  modified: bool = False) -> None:
    """Feed `parent_tid` to the (just added, last) callee input `sub_tid` at call site `op`.

    A Call's inputs match its callee's inputs one to one; a Loop's callee has two extra leading
    inputs (iteration, condition). With `modified` the call site writes the callee's final value
    back to `parent_tid` (upstream: the op modifies that input's region).
    """
    if op.type not in ("Call", "Loop"):
        raise NotImplementedError(f"connect_input: cannot add inputs to {op.describe()} "
                                  f"(only Call and Loop sites)")
    callee = graphs[op.called[0]]
    offset = 2 if op.type == "Loop" else 0
    if callee.inputs.index(sub_tid) - offset != len(op.inputs):
        raise ValueError(f"connect_input: callee input '{sub_tid}' of '{callee.id}' is not the "
                         f"next input of {op.describe()}")
    op.inputs = op.inputs + (parent_tid,)
    if modified:
        op.attrs["modified"] = tuple(sorted(set(op.attrs.get("modified", ())) |
                                            {len(op.inputs) - 1}))


def find_op(gd: GraphData, op_id: int) -> Optional[Op]:
    """The op of `gd` with IR-wide id `op_id`, or None."""
    for op in gd.ops:
        if op.id == op_id:
            return op
    return None
