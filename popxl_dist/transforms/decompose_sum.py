"""`decompose_sum`: split the gradient sums autodiff makes into chains of additions."""
from __future__ import annotations

from .. import context
from .._ir import surgery
from ..graph import Graph

__all__ = ["decompose_sum"]


def decompose_sum(graph: Graph) -> Graph:
    """Replace every `Sum` op of `graph` (autodiff's sum of several gradient contributions) by
    `Add(x0, x1)` followed by `AddLhsInplace(partial, xi)` for the other inputs, in place of the
    Sum, so each contribution can be freed once added (upstream's liveness motivation).

    The additions run in the Sum's order with the same rounding, so the values are bitwise the
    same. (Upstream starts the chain from a zero tensor; adding to zero would turn a -0.0 into
    +0.0, so the emulator starts from the first two contributions.)

    Returns:
        `graph`, modified.
    """
    from .. import ops

    if not isinstance(graph, Graph):
        raise TypeError(f"decompose_sum: expected a popxl.Graph, got {type(graph).__name__}")
    gd = graph._data
    for op in [o for o in gd.ops if o.type == "Sum"]:
        first_new = len(gd.ops)
        ins = [graph._tensor(t) for t in op.inputs]
        with graph, context.ipu(op.ipu):
            partial = ops.add(ins[0], ins[1])
            for t in ins[2:]:
                partial = ops.add_(partial, t)
        new_ops = gd.ops[first_new:]
        del gd.ops[first_new:]
        at = gd.ops.index(op)
        gd.ops[at:at] = new_ops
        surgery.replace_uses(gd, op.outputs[0], partial.id)
        surgery.remove_ops(graph, [op])
    return graph
