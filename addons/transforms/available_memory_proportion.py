"""Setting the available-memory proportion of ops by the IPU they run on (a Poplar planning
hint: recorded on the ops, no effect on the numbers)."""
from __future__ import annotations

from typing import Sequence

import popxl

__all__ = ["set_available_memory_proportion_by_ipu", "set_graph_available_memory_proportion_by_ipu"]

# Op types whose upstream op has `setAvailableMemoryProportion`.
AMP_OP_TYPES = frozenset({"MatMul", "Conv", "ConvTranspose", "Gather", "TiedGather",
                          "GroupedGather", "Scatter", "ScatterReduce", "GroupedScatterReduce",
                          "TopK", "RoiAlign"})


def _check(proportions: Sequence[float]) -> list:
    props = list(proportions)
    for p in props:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"available memory proportions must be numbers in (0, 1], got "
                             f"{proportions!r}")
    return props


def set_graph_available_memory_proportion_by_ipu(graph: popxl.Graph,
                                                 proportions: Sequence[float]) -> None:
    """Give every op of `graph` that takes the hint `proportions[op ipu]`."""
    props = _check(proportions)
    for op in graph._data.ops:
        if op.type in AMP_OP_TYPES and op.ipu is not None:     # (unplaced: popxl.ipu(None))
            if op.ipu >= len(props):
                raise ValueError(f"set_graph_available_memory_proportion_by_ipu: "
                                 f"{op.describe()} runs on IPU {op.ipu}, but only "
                                 f"{len(props)} proportion(s) were given")
            op.attrs["available_memory_proportion"] = float(props[op.ipu])


def set_available_memory_proportion_by_ipu(ir: popxl.Ir, proportions: Sequence[float]) -> None:
    """`set_graph_available_memory_proportion_by_ipu` on every graph of `ir`."""
    props = _check(proportions)
    for gid in list(ir._data.graphs):
        set_graph_available_memory_proportion_by_ipu(ir._graph(gid), props)
