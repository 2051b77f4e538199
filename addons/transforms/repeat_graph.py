"""`repeat_graph`: run every op of a graph `repeat_count` times."""
from __future__ import annotations

from typing import Dict, List

import popxl
from popxl import ops
from popxl._ir import surgery
from popxl._ir.records import TensorKind

__all__ = ["repeat_graph"]


def repeat_graph(graph: popxl.Graph, repeat_count: int) -> popxl.Graph:
    """Move every op of `graph` (the main graph too) into a new graph "repeat_graph" and call
    it with `ops.repeat_with_info(..., repeat_count)` in their place.

    Tensors the ops read from outside (graph inputs, variables, RTS shards) become by-ref inputs
    of the new graph, so in-place updates persist across iterations and after the loop;
    constants are copied into it. Outputs of `graph` produced by the moved ops become
    loop-carried values (zero before the first iteration); `graph` outputs their values after
    the last one. Ops of the main graph's WeightsFromHost / WeightsToHost fragments stay.
    A `host_store` inside runs `repeat_count` times: set `ir.num_host_transfers` to match.
    The ops keep their creation order, so `in_sequence` order is kept.

    Args:
        graph: the graph whose ops to repeat.
        repeat_count: iterations; `<= 1` returns `graph` untouched.

    Returns:
        The new graph holding the ops (or `graph` when nothing was done).
    """
    if not isinstance(graph, popxl.Graph):
        raise TypeError(f"repeat_graph: 'graph' must be a popxl.Graph, got "
                        f"{type(graph).__name__}")
    if isinstance(repeat_count, bool) or not isinstance(repeat_count, int):
        raise TypeError(f"repeat_graph: 'repeat_count' must be an int, got {repeat_count!r}")
    if repeat_count <= 1:
        return graph
    ir = graph.ir
    gd = graph._data
    moving = [op for op in gd.ops if op.exec_ctx == "Normal"]
    moved_outputs = {t for op in moving for t in op.outputs}
    for op in gd.ops:
        if op.exec_ctx != "Normal" and any(t in moved_outputs for t in op.inputs):
            raise ValueError(f"repeat_graph: {op.describe()} ({op.exec_ctx}) reads a tensor "
                             f"computed by the ops being repeated")
    body = ir.create_empty_graph("repeat_graph")
    tmap: Dict[str, str] = {}
    externals: List[str] = []
    for op in moving:
        for t in op.inputs:
            if t in tmap:
                continue
            info = gd.tensors[t]
            name = surgery.tensor_name(gd, t)
            if info.kind == TensorKind.CONSTANT:
                tmap[t] = surgery.new_tensor(body, info, name, TensorKind.CONSTANT)
            else:
                tmap[t] = surgery.add_input(body, info, name, by_ref=True)
                externals.append(t)
        surgery.clone_op(body, gd, op, tmap)
    carried = [t for t in gd.outputs if t in moved_outputs]
    carried_inputs = [surgery.add_input(body, gd.tensors[t], f"{surgery.tensor_name(gd, t)}_prev")
                      for t in carried]
    bd = body._data
    bd.inputs = carried_inputs + [tmap[t] for t in externals]
    bd.outputs = [tmap[t] for t in carried]
    surgery.remove_ops(graph, moving)
    with graph:
        initial = [ops.init(body._tensor(t).shape, body._tensor(t).dtype,
                            f"{surgery.tensor_name(bd, t)}_init", "zero") for t in carried_inputs]
        inputs = {body._tensor(tmap[t]): graph._tensor(t) for t in externals}
        info = ops.repeat_with_info(body, repeat_count, *initial, inputs_dict=inputs)
    outs = dict(zip(carried, (t.id for t in info.outputs)))
    gd.outputs = [outs.get(t, t) for t in gd.outputs]
    return body
