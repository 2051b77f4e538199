"""Types shared by the graph helpers, and the normalisation of `called_graphs_grad_info`
(whose keys may be graphs or graph wrappers, and values GradGraphInfos or gradient graphs)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple, Union

import popxl
from popxl.transforms import GradGraphInfo

if TYPE_CHECKING:
    from .graph import BoundGraph, GraphWithNamedArgs

__all__ = ["GraphLike", "GradGraphInfoLike", "CalledGraphsGradInfoLike", "CalledGraphsGradInfo"]

GraphLike = Union[popxl.Graph, "GraphWithNamedArgs", "BoundGraph"]
GradGraphInfoLike = Union[GradGraphInfo, "GraphWithNamedArgs"]
CalledGraphsGradInfoLike = Mapping[GraphLike, GradGraphInfoLike]
CalledGraphsGradInfo = Mapping[popxl.Graph, GradGraphInfo]


def _graph_of(g: Any) -> popxl.Graph:
    from .graph import BoundGraph, GraphWithNamedArgs

    if isinstance(g, (GraphWithNamedArgs, BoundGraph, GradGraphInfo)):
        return g.graph
    if isinstance(g, popxl.Graph):
        return g
    raise TypeError(f"Expected a Graph, GraphWithNamedArgs, BoundGraph or GradGraphInfo, got "
                    f"{type(g).__name__}")


def _grad_info_of(v: Any) -> GradGraphInfo:
    from .graph import GraphWithNamedArgs

    if isinstance(v, GradGraphInfo):
        return v
    if isinstance(v, GraphWithNamedArgs):
        return v.grad_graph_info
    raise TypeError(f"called_graphs_grad_info values must be GradGraphInfo or "
                    f"GraphWithNamedArgs, got {type(v).__name__}")


def _normalise_called_graphs_grad_info(fwd_graph: GraphLike, grad_graph: GradGraphInfoLike
                                       ) -> Tuple[popxl.Graph, GradGraphInfo]:
    """(forward popxl.Graph, its GradGraphInfo) from any graph-like pair."""
    return _graph_of(fwd_graph), _grad_info_of(grad_graph)


def _normalise_called_graphs_grad_info_dict(
        called_graphs_grad_info: Optional[CalledGraphsGradInfoLike] = None
) -> Dict[popxl.Graph, GradGraphInfo]:
    """`{popxl.Graph: GradGraphInfo}` from a mapping of graph-likes (None: empty)."""
    return dict(_normalise_called_graphs_grad_info(k, v)
                for k, v in (called_graphs_grad_info or {}).items())
