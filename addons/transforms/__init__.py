"""popxl_addons transforms (`addons.transforms.autodiff` is the function)."""
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from ..graph import BoundGraph, GraphWithNamedArgs
from ..utils import suffix_graph_name
from .autodiff import autodiff, autodiff_with_accumulation, remap_grad_info
from .available_memory_proportion import (set_available_memory_proportion_by_ipu,
                                          set_graph_available_memory_proportion_by_ipu)
from .batch_serialisation import (RemoteHandle, batch_serial_buffer, batch_serialise,
                                  batch_serialise_fwd_and_grad)
from .pipelining import pipelined_execution
from .recomputation import add_recompute_inputs, recompute_graph
from .use_fc_pass import disable_fc_pass, enable_fc_pass

__all__ = ["autodiff", "autodiff_with_accumulation", "remap_grad_info", "recompute_graph",
           "add_recompute_inputs", "pipelined_execution", "batch_serialise",
           "batch_serialise_fwd_and_grad", "batch_serial_buffer", "RemoteHandle",
           "set_available_memory_proportion_by_ipu", "set_graph_available_memory_proportion_by_ipu",
           "disable_fc_pass", "enable_fc_pass",
           # names upstream's `import *` chain leaks into this namespace
           "BoundGraph", "GraphWithNamedArgs", "ExpectedConnection", "ExpectedConnectionType",
           "GradGraphInfo", "suffix_graph_name"]
