"""popxl_addons transforms (`addons.transforms.autodiff` is the function)."""
from .autodiff import autodiff, autodiff_with_accumulation, remap_grad_info
from .pipelining import pipelined_execution
from .recomputation import recompute_graph

__all__ = ["autodiff", "autodiff_with_accumulation", "remap_grad_info", "recompute_graph",
           "pipelined_execution"]
