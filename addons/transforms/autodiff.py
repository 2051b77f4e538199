"""`autodiff` and `autodiff_with_accumulation` on `GraphWithNamedArgs`."""
from __future__ import annotations

from functools import partial
from typing import Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

import popxl
from popxl import ops
from popxl.transforms import ExpectedConnection, GradGraphInfo
from popxl.transforms.patterns import apply_pre_alias_patterns

from ..dot_tree import sanitise
from ..graph import GraphWithNamedArgs
from ..graph_common import GraphLike, _graph_of, _normalise_called_graphs_grad_info_dict
from ..named_replica_grouping import NamedReplicaGrouping
from ..named_tensors import NamedTensors
from ..variable_factory import NamedVariableFactories, add_variable_input

__all__ = ["autodiff", "autodiff_with_accumulation", "remap_grad_info"]

def _merged_grad_infos(graph, called_graphs_grad_info: Optional[Mapping]) -> Dict:
    merged = dict(getattr(graph, "called_graphs_grad_info", None) or {})
    merged.update(called_graphs_grad_info or {})
    return _normalise_called_graphs_grad_info_dict(merged)


def autodiff(graph: GraphLike, grads_provided: Optional[Iterable[popxl.Tensor]] = None,
             grads_required: Optional[Iterable[popxl.Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping] = None) -> GraphWithNamedArgs:
    """The gradient graph of `graph` (popxl autodiff; the forward graph gains outputs for the
    activations the gradient needs). Returns it with empty named args.

    As upstream, the "default" pre-alias patterns are applied to every gradient graph made:
    OpToIdentity turns the `*_identical_inputs` collectives that gradients of
    `*_identical_grad_inputs` ones produce into identities. (Upstream's other patterns, and its
    inplace pattern, change op types only, e.g. `Mul` -> `MulRhsInplace`, and are not applied.)
    """
    g = _graph_of(graph)
    infos = popxl.transforms.autodiff(
        g, grads_provided=grads_provided, grads_required=grads_required,
        called_graphs_grad_info=_merged_grad_infos(graph, called_graphs_grad_info),
        return_all_grad_graphs=True)
    for info in infos.values():
        apply_pre_alias_patterns(info.graph, "default")
    return GraphWithNamedArgs.from_grad_graph(infos[g])


def autodiff_with_accumulation(
        graph: GraphLike, tensors_to_accumulate_grads: Iterable[popxl.Tensor],
        grads_provided: Optional[Iterable[popxl.Tensor]] = None,
        grads_required: Optional[Iterable[popxl.Tensor]] = None,
        called_graphs_grad_info: Optional[Mapping] = None,
        replica_groupings: Optional[NamedReplicaGrouping] = None
) -> Tuple[NamedVariableFactories, GraphWithNamedArgs]:
    """Autodiff whose gradient graph accumulates the running mean of some gradients.

    The gradient graph gains by-ref inputs `mean_accum_counter` (float32 scalar) and
    `accum.<name>` per tensor (`name` from `graph.args`, else the sanitised tensor name); each
    call does `accumulate_mean_(accum, grad, counter)` then `counter += 1`, and those gradients
    are no longer outputs. Reset with `ops.var_updates.accumulator_scale_(counter, 0.0)`.

    Returns:
        (factories of the new inputs, the gradient graph with them as named args).
    """
    to_acc = list(tensors_to_accumulate_grads)
    user_required = list(grads_required or [])
    required = user_required + to_acc
    dgraph = autodiff(graph, grads_provided, required, called_graphs_grad_info)
    info = dgraph.grad_graph_info
    bwd = dgraph.graph
    names: Dict[str, str] = {}
    if isinstance(graph, GraphWithNamedArgs):
        names = {t.id: k for k, t in graph.args.to_dict().items()}
    factories = NamedVariableFactories()
    named = NamedTensors()
    grad_outputs = bwd.outputs
    first = len(grad_outputs) - len(to_acc)
    with bwd, popxl.in_sequence(True):
        counter, vf = add_variable_input("mean_accum_counter", partial(np.zeros, ()),
                                         popxl.float32, by_ref=True)
        factories.insert("mean_accum_counter", vf)
        named.insert("mean_accum_counter", counter)
        for i, t in enumerate(to_acc):
            name = names.get(t.id, sanitise(t.name))
            rg = None
            if replica_groupings is not None and name in replica_groupings:
                rg = replica_groupings.get(name)
            accum, vf = add_variable_input(f"accum.{name}", partial(np.zeros, t.shape), t.dtype,
                                           by_ref=True, replica_grouping=rg)
            factories.insert(f"accum.{name}", vf)
            named.insert(f"accum.{name}", accum)
            ops.var_updates.accumulate_mean_(accum, grad_outputs[first + i], counter)
        ops.var_updates.accumulate_(counter, popxl.constant(1.0, popxl.float32))
    pb = bwd._pb_graph
    for idx in reversed(range(first, len(grad_outputs))):
        pb.removeOutput(idx)
    # Upstream leaves `expected_outputs` stale (still listing the removed gradients).
    return factories, GraphWithNamedArgs(bwd, named, grad_graph_info=info)


def remap_grad_info(grad_info: GradGraphInfo, forward_graph: popxl.Graph,
                    backward_graph: popxl.Graph) -> GradGraphInfo:
    """The same expected connections, by index, against another forward/backward pair."""
    fwd_old = grad_info.forward_graph
    old_ins = list(fwd_old.inputs)
    old_outs = list(fwd_old.outputs)
    new_ins, new_outs = forward_graph.inputs, forward_graph.outputs

    def remap(t):
        if t in old_ins:
            return new_ins[old_ins.index(t)]
        if t in old_outs:
            return new_outs[old_outs.index(t)]
        raise ValueError(f"remap_grad_info: '{t.id}' is not an input or output of "
                         f"'{fwd_old.id}'")

    ins = [ExpectedConnection(remap(e.fwd_tensor), e.connection_type)
           for e in grad_info.expected_inputs]
    outs = [ExpectedConnection(remap(e.fwd_tensor), e.connection_type)
            for e in grad_info.expected_outputs]
    return GradGraphInfo(backward_graph, forward_graph, ins, outs)
