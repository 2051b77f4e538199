"""Make a tensor of an ancestor graph usable inside a (deeper) subgraph after the fact."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import popxl
from popxl._ir import surgery
from popxl._ir.records import GraphData, Op

__all__ = ["is_subgraph", "called_graph_paths", "connect_call_op", "connect_loop_op",
           "connect_tensor_to_ops_on_path", "route_tensor_into_graph"]


def _callees(graphs: Dict[str, GraphData], gid: str) -> List[Tuple[Op, str]]:
    return [(op, c) for op in graphs[gid].ops for c in op.called]


def is_subgraph(parent: popxl.Graph, subgraph: popxl.Graph) -> bool:
    """Whether `subgraph` is called, directly or through other graphs, by `parent`."""
    graphs = parent.ir._data.graphs
    seen, todo = set(), [parent.id]
    while todo:
        for _, c in _callees(graphs, todo.pop()):
            if c == subgraph.id:
                return True
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return False


def called_graph_paths(parent_graph: popxl.Graph, subgraph: popxl.Graph) -> List[List[Op]]:
    """Every chain of call / loop / if ops leading from `parent_graph` to `subgraph`."""
    graphs = parent_graph.ir._data.graphs
    paths: List[List[Op]] = []

    def walk(gid: str, path: List[Op], visiting: frozenset) -> None:
        for op, c in _callees(graphs, gid):
            if c == subgraph.id:
                paths.append(path + [op])
            elif c not in visiting:
                walk(c, path + [op], visiting | {c})

    walk(parent_graph.id, [], frozenset({parent_graph.id}))
    return paths


def _record(op) -> Op:
    """The op record of `op` (a record, or an `_ir.Op` view from `_pb_graph.getOps()`)."""
    rec = getattr(op, "_op", op)
    if not isinstance(rec, Op):
        raise TypeError(f"expected an op (a called_graph_paths element), got {op!r}")
    return rec


def _connect(op, tensor: popxl.Tensor, input_tensors: Dict[str, popxl.Tensor],
             modified: bool, kind: str, what: str) -> popxl.Tensor:
    rec = _record(op)
    if rec.type != kind:
        raise TypeError(f"{what}: expected a {kind} op, got {rec.describe()}")
    if not isinstance(tensor, popxl.Tensor):
        raise TypeError(f"{what}: 'tensor' must be a popxl.Tensor, got {type(tensor).__name__}")
    ir = tensor.ir
    graphs = ir._data.graphs
    if rec not in tensor._graph._data.ops:
        raise ValueError(f"{what}: {rec.describe()} is not in the graph of tensor '{tensor.id}' "
                         f"('{tensor._graph.id}')")
    gid = rec.called[0]
    callee = ir._graph(gid)
    offset = 2 if kind == "Loop" else 0
    sub = input_tensors.get(gid)
    if sub is None:
        sub = callee._tensor(surgery.add_input(callee, tensor._info,
                                               surgery.tensor_name(tensor._graph._data,
                                                                   tensor.id),
                                               by_ref=modified))
        input_tensors[gid] = sub
    i = callee._data.inputs.index(sub.id) - offset
    if not (i < len(rec.inputs) and rec.inputs[i] == tensor.id):    # not passed here yet
        surgery.connect_input(graphs, rec, tensor.id, sub.id, modified)
    return sub


def connect_call_op(op, tensor: popxl.Tensor, input_tensors: Dict[str, popxl.Tensor],
                    modified: bool) -> popxl.Tensor:
    """Pass `tensor` (of the graph holding call op `op`) into the graph `op` calls.

    The callee gains an input for it unless `input_tensors` ({graph id: routed tensor}, updated
    here) already has one; `op` then feeds `tensor` to that input (by reference with
    `modified`, so in-place updates in the callee reach `tensor`). Other call sites of the
    callee are not changed: pass the tensor there too. Returns the callee's tensor.
    """
    return _connect(op, tensor, input_tensors, modified, "Call", "connect_call_op")


def connect_loop_op(op, tensor: popxl.Tensor, input_tensors: Dict[str, popxl.Tensor],
                    modified: bool) -> popxl.Tensor:
    """`connect_call_op` for a loop (`ops.repeat`) op: the body gains an input that every
    iteration reads (not loop-carried)."""
    return _connect(op, tensor, input_tensors, modified, "Loop", "connect_loop_op")


def connect_tensor_to_ops_on_path(path: List[Op], from_tensor: popxl.Tensor,
                                  input_tensors: Dict[str, popxl.Tensor],
                                  modified: bool) -> popxl.Tensor:
    """Route `from_tensor` down `path` (a `called_graph_paths` element: call / loop ops, the
    first in `from_tensor`'s graph, each in the graph the previous one calls). Returns the
    tensor of the last op's callee."""
    t = from_tensor
    for op in path:
        rec = _record(op)
        if rec.type == "Call":
            t = connect_call_op(rec, t, input_tensors, modified)
        elif rec.type == "Loop":
            t = connect_loop_op(rec, t, input_tensors, modified)
        else:
            raise NotImplementedError(f"connect_tensor_to_ops_on_path: cannot route a tensor "
                                      f"through {rec.describe()} (only call and loop ops)")
    return t


def route_tensor_into_graph(tensor: popxl.Tensor, graph: Optional[popxl.Graph] = None,
                            modified: bool = False) -> popxl.Tensor:
    """The tensor of `graph` (default: the current graph) that carries `tensor`, a tensor of an
    ancestor graph.

    Every graph on every call path from `tensor`'s graph to `graph` gains an input, and each of
    their call (or repeat) sites passes the tensor on; a site that already passes it is reused.
    Graphs that are also called from graphs the tensor cannot reach cannot be routed through.

    Args:
        tensor: a tensor of an ancestor graph (returned as it is if already in `graph`).
        graph: the target graph.
        modified: the routed inputs are written back to `tensor` at every site (by reference),
            so in-place updates inside `graph` change `tensor`.

    Returns:
        The input of `graph` holding `tensor`.
    """
    if not isinstance(tensor, popxl.Tensor):
        raise TypeError(f"route_tensor_into_graph: 'tensor' must be a popxl.Tensor, got "
                        f"{type(tensor).__name__}")
    graph = graph if graph is not None else popxl.gcg()
    src = tensor._graph
    if graph == src:
        return tensor
    if src.ir is not graph.ir or not is_subgraph(src, graph):
        raise ValueError(f"Tensor '{tensor.id}' is not in the graph '{graph.id}' and its graph "
                         f"'{src.id}' is not in a known parent graph of '{graph.id}'")
    ir_data = graph.ir._data
    graphs = ir_data.graphs
    routed: Dict[str, str] = {src.id: tensor.id}
    info = src._data.tensors[tensor.id]

    def ensure(gid: str) -> str:
        if gid in routed:
            return routed[gid]
        g = graph.ir._graph(gid)
        if not is_subgraph(src, g):
            raise ValueError(f"Tensor '{tensor.id}' is not in the graph '{gid}' and '{src.id}' "
                             f"is not in a known parent graph of '{gid}'")
        sites = surgery.call_sites(graphs, gid)
        parents = [ensure(pgd.id) for pgd, _ in sites]
        reuse = _existing_input(graphs, gid, sites, parents)
        if reuse is None:
            reuse = surgery.add_input(g, info, surgery.tensor_name(src._data, tensor.id),
                                      by_ref=modified)
            for (pgd, op), ptid in zip(sites, parents):
                surgery.connect_input(graphs, op, ptid, reuse, modified)
        routed[gid] = reuse
        return reuse

    return graph._tensor(ensure(graph.id))


def _existing_input(graphs: Dict[str, GraphData], gid: str, sites, parents) -> Optional[str]:
    """The callee input every site already feeds with the routed tensor, if there is one."""
    found = None
    for (_, op), ptid in zip(sites, parents):
        if op.type not in ("Call", "Loop") or ptid not in op.inputs:
            return None
        offset = 2 if op.type == "Loop" else 0
        sub = graphs[gid].inputs[op.inputs.index(ptid) + offset]
        if found not in (None, sub):
            return None
        found = sub
    return found
