"""The strided all-reduces (op `ReplicatedAllReduceStrided`) and their graph form."""
from __future__ import annotations

import popxl
from popxl.ops._tensor_parallel import ALL_REDUCE_STRIDED, replicated_all_reduce_identical

from ...graph import GraphWithNamedArgs
from ...named_tensors import NamedTensors
from ...utils import null_context
from ._checks import check_group, check_reduce_op, check_tensor

__all__ = [
    "replicated_all_reduce_strided",
    "replicated_all_reduce_strided_graph",
    "replicated_all_reduce_strided_identical_grad_inputs",
    "replicated_all_reduce_strided_identical_inputs",
]


def _all_reduce_strided(opname: str, t: popxl.Tensor, op: str,
                        group: popxl.ReplicaGrouping | None, identical_inputs: bool,
                        identical_grad_inputs: bool) -> popxl.Tensor:
    check_tensor(t, opname)
    op = check_reduce_op(op, opname)
    group = check_group(group, opname)
    return replicated_all_reduce_identical(opname, ALL_REDUCE_STRIDED, t, op, group,
                                           identical_inputs, identical_grad_inputs)


def replicated_all_reduce_strided(t: popxl.Tensor, op: str = "add",
                                  group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Every member of the group gets the reduction of `t` over the group; the gradient is the
    all-reduce of the output gradients.

    Args:
        t: the tensor to reduce.
        op: "add" or "mean".
        group: constant-stride grouping (None: all replicas).
    """
    return _all_reduce_strided("replicated_all_reduce_strided", t, op, group, False, False)


def replicated_all_reduce_strided_identical_inputs(
        t: popxl.Tensor, op: str = "add",
        group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Forward identity (the input is identical on every member; needs the OpToIdentity
    pattern), gradient all-reduce over the group. Arguments as `replicated_all_reduce_strided`.
    """
    return _all_reduce_strided("replicated_all_reduce_strided_identical_inputs", t, op, group,
                               True, False)


def replicated_all_reduce_strided_identical_grad_inputs(
        t: popxl.Tensor, op: str = "add",
        group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Forward all-reduce over the group, gradient identity (the output gradient is identical
    on every member). Arguments as `replicated_all_reduce_strided`."""
    return _all_reduce_strided("replicated_all_reduce_strided_identical_grad_inputs", t, op,
                               group, False, True)


def replicated_all_reduce_strided_graph(tensors: NamedTensors, op: str = "add",
                                        group: popxl.ReplicaGrouping | None = None,
                                        use_io_tiles: bool = False
                                        ) -> tuple[GraphWithNamedArgs, list]:
    """A graph "all_reduce_strided" with one named input per tensor (sorted keys) and the
    all-reduced tensors as outputs, in the same order. Returns `(graph, names)`.

    (Upstream passes its arguments to the op in the wrong order; this follows the intent.)
    """
    opname = "replicated_all_reduce_strided_graph"
    op = check_reduce_op(op, opname)
    group = check_group(group, opname)
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("all_reduce_strided")
    names, args = [], {}
    tiles = popxl.io_tiles() if use_io_tiles else null_context()
    with graph, tiles, popxl.in_sequence(False):
        for name, t in zip(*tensors.unpack()):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape or None)
            popxl.graph_output(replicated_all_reduce_strided(x, op, group))
            args[name] = x
            names.append(name)
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names
