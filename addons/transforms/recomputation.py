"""`recompute_graph`: a gradient graph that recomputes its forward activations."""
from __future__ import annotations

from typing import Dict, List, Tuple

import popxl
from popxl import ops
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from ..graph import GraphWithNamedArgs
from ..utils import suffix_graph_name

__all__ = ["recompute_graph", "add_recompute_inputs"]


def _input_like(t: popxl.Tensor, by_ref: bool = False) -> popxl.Tensor:
    return popxl.graph_input(t.shape, t.dtype, t.name, by_ref=by_ref,
                             meta_shape=t.meta_shape or None)


def add_recompute_inputs(grad_info: GradGraphInfo
                         ) -> Tuple[Dict[popxl.Tensor, popxl.Tensor],
                                    Dict[popxl.Tensor, popxl.Tensor], List[ExpectedConnection]]:
    """Add to the current graph the inputs a recomputing gradient graph needs.

    In the order of `grad_info.expected_inputs`: an input per `FwdGrad` connection and per `Fwd`
    connection to a forward-graph *input*; then an input per remaining forward-graph input, by
    name. (`Fwd` connections to forward activations get no input: the forward graph is called
    again.)

    Returns:
        ({forward input: new input}, {gradient-graph input: new input}, the expected
        connections of the new inputs, in input order).
    """
    fwd_map: Dict[popxl.Tensor, popxl.Tensor] = {}
    grad_map: Dict[popxl.Tensor, popxl.Tensor] = {}
    conns: List[ExpectedConnection] = []
    fwd_inputs = grad_info.forward_graph.inputs
    grad_inputs = grad_info.graph.inputs
    for idx, ec in enumerate(grad_info.expected_inputs):
        if ec.connection_type == ExpectedConnectionType.FwdGrad:
            grad_map[grad_inputs[idx]] = _input_like(grad_inputs[idx])
            conns.append(ec)
        elif ec.fwd_tensor in fwd_inputs and ec.fwd_tensor not in fwd_map:
            fwd_map[ec.fwd_tensor] = _input_like(ec.fwd_tensor)
            conns.append(ec)
    for t in sorted((t for t in fwd_inputs if t not in fwd_map), key=lambda t: t.name):
        fwd_map[t] = _input_like(t)
        conns.append(ExpectedConnection(t, ExpectedConnectionType.Fwd))
    return fwd_map, grad_map, conns


def recompute_graph(grad_graph: GraphWithNamedArgs) -> GraphWithNamedArgs:
    """A new graph `<grad>_recomp` that calls the forward graph, then the gradient graph.

    Its inputs are those of `add_recompute_inputs`, then the gradient graph's other inputs
    (e.g. accumulators; by-ref kept) by name. Its `GradGraphInfo` connects `Fwd` inputs to
    forward *inputs* only, so no activation needs to be kept alive. Numerics equal the original
    gradient graph's.
    """
    info = grad_graph.grad_graph_info
    fwd: popxl.Graph = info.forward_graph
    bwd: popxl.Graph = info.graph
    ir = bwd.ir
    new_graph = ir.create_empty_graph(suffix_graph_name(bwd.name, "recomp"))
    with new_graph:
        fwd_map, remap, conns = add_recompute_inputs(info)
        fwd_info = ops.call_with_info(fwd, inputs_dict=fwd_map)
        remap.update(info.inputs_dict(fwd_info))
        by_ref = bwd._by_ref_inputs
        for t in sorted((t for t in bwd.inputs if t not in remap), key=lambda t: t.name):
            remap[t] = _input_like(t, by_ref=t in by_ref)
        outs = ops.call(bwd, inputs_dict=remap)
        for o in outs:
            popxl.graph_output(o)
    # Connections for the inputs beyond the expected ones are not part of the info (as for
    # the gradient graph); they stay named args.
    new_info = GradGraphInfo(new_graph, fwd, conns, info.expected_outputs)
    args = grad_graph.args.remap(remap) if grad_graph.args.len_flat() else grad_graph.args.copy()
    return GraphWithNamedArgs(new_graph, args, grad_graph_info=new_info)
