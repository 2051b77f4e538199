"""popxl_addons transforms (`addons.transforms.autodiff` is the function)."""
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from ..graph import BoundGraph, GraphWithNamedArgs
from ..utils import suffix_graph_name
from .autodiff import autodiff, autodiff_with_accumulation, remap_grad_info
from .recomputation import add_recompute_inputs, recompute_graph

__all__ = ["autodiff", "autodiff_with_accumulation", "remap_grad_info", "recompute_graph",
           "add_recompute_inputs",
           # names upstream's `import *` chain leaks into this namespace
           "BoundGraph", "GraphWithNamedArgs", "ExpectedConnection", "ExpectedConnectionType",
           "GradGraphInfo", "suffix_graph_name"]
