"""`recompute_graph`: a gradient graph that recomputes its forward activations."""
from __future__ import annotations

from typing import Dict, List

import popxl
from popxl import ops
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from ..graph import GraphWithNamedArgs
from ..utils import suffix_graph_name

__all__ = ["recompute_graph", "add_recompute_inputs"]


def add_recompute_inputs(grad_info: GradGraphInfo) -> List[ExpectedConnection]:
    """The expected inputs of a gradient graph that recomputes its activations: the `FwdGrad`
    inputs of `grad_info` in order, then a `Fwd` connection per forward-graph input (the
    forward graph is called again from those, so no activation has to be kept)."""
    conns = [e for e in grad_info.expected_inputs
             if e.connection_type == ExpectedConnectionType.FwdGrad]
    conns += [ExpectedConnection(t, ExpectedConnectionType.Fwd)
              for t in grad_info.forward_graph.inputs]
    return conns


def recompute_graph(grad_graph: GraphWithNamedArgs) -> GraphWithNamedArgs:
    """A new graph `<grad>_recomp` that calls the forward graph, then the gradient graph.

    Its inputs are the `FwdGrad` inputs of the gradient graph, then the forward graph's inputs,
    then any other gradient-graph input (e.g. accumulators, by-ref kept). Its `GradGraphInfo`
    connects `Fwd` inputs to forward *inputs* only, so no activation needs to be kept alive.
    Numerics equal the original gradient graph's.
    """
    info = grad_graph.grad_graph_info
    fwd: popxl.Graph = info.forward_graph
    bwd: popxl.Graph = info.graph
    ir = bwd.ir
    b_ins = list(bwd.inputs)
    expected = list(info.expected_inputs)
    by_ref = bwd._by_ref_inputs
    name = suffix_graph_name(bwd.name, "recomp")
    new_graph = ir.create_empty_graph(name)
    in_conns = add_recompute_inputs(info)
    remap: Dict[popxl.Tensor, popxl.Tensor] = {}   # bwd input -> new input
    with new_graph:
        for i, e in enumerate(expected):
            if e.connection_type == ExpectedConnectionType.FwdGrad:
                t = b_ins[i]
                remap[t] = popxl.graph_input(t.shape, t.dtype, t.name,
                                             meta_shape=t.meta_shape or None)
        fwd_in_map: Dict[popxl.Tensor, popxl.Tensor] = {}
        for t in fwd.inputs:
            fwd_in_map[t] = popxl.graph_input(t.shape, t.dtype, t.name,
                                              meta_shape=t.meta_shape or None)
        for t in b_ins[len(expected):]:
            remap[t] = popxl.graph_input(t.shape, t.dtype, t.name, by_ref=t in by_ref,
                                         meta_shape=t.meta_shape or None)
        fwd_info = ops.call_with_info(fwd, *[fwd_in_map[t] for t in fwd.inputs])
        for i, e in enumerate(expected):
            if e.connection_type == ExpectedConnectionType.Fwd:
                remap[b_ins[i]] = fwd_info.graph_to_parent(e.fwd_tensor)
        outs = ops.call(bwd, *[remap[t] for t in b_ins])
        for o in outs:
            popxl.graph_output(o)
    # Connections for the inputs beyond the expected ones are not part of the info (as for
    # the gradient graph); they stay named args.
    new_info = GradGraphInfo(new_graph, fwd, in_conns, info.expected_outputs)
    args = grad_graph.args.remap(remap) if grad_graph.args.len_flat() else grad_graph.args.copy()
    return GraphWithNamedArgs(new_graph, args, grad_graph_info=new_info)
