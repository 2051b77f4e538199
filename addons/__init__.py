"""popxl.addons on the popxl-dist emulator: Modules with named variable inputs, DotTree
collections, graph caching, autodiff helpers, optimisers and layers.

Import as `import popxl_addons as addons`. Unlike upstream, importing does not need GitPython,
cppimport, mpi4py or popdist; `GIT_COMMIT` is read from `.git` directly (or None).
"""

from popxl import Ir, ReplicaGrouping, Tensor
from popxl.context import get_current_context
from popxl.tensor import HostTensor
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from . import debugging, ops, performance_utils, remote, rts, transforms
from .array_munging import *  # noqa: F401,F403
from .array_munging import __all__ as _am_all
from .dot_tree import DotTree, sanitise, to_mapping
from .graph import BoundGraph, GraphWithNamedArgs
from .graph_cache import (GraphCache, argument_hash, bound_arguments, function,
                          get_function_hash, tensor_hash)
from .graph_common import (CalledGraphsGradInfo, CalledGraphsGradInfoLike, GradGraphInfoLike,
                           GraphLike)
from .module import Module, NameScopeMeta, create_grad_graph_info
from .named_replica_grouping import NamedReplicaGrouping
from .named_tensors import NamedTensorData, NamedTensors
from .ops import cross_entropy, cross_entropy_with_grad, fp8_amax_scale, host_load, host_store
from .debugging import print_tensor, print_text
from .performance_utils import (evaluate_FLOPs, evaluate_ir_FLOPs, format_flops_scientific,
                                print_FLOPs, total_FLOPs)
from .route_tensor import is_subgraph, route_tensor_into_graph
from .seed_variable import seed_variable
from .remote import (
    create_remote_buffer,
    load_remote_graph,
    named_buffers,
    named_variable_buffers,
    store_remote_graph,
)
from .streams import InputStreams, OutputStreams
from .task_session import TaskSession, initialise_memmap_dir_from_checkpoint, write_variables_pb
from .transforms import (
    RemoteHandle,
    add_recompute_inputs,
    autodiff,
    autodiff_with_accumulation,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
    disable_fc_pass,
    enable_fc_pass,
    pipelined_execution,
    recompute_graph,
    set_available_memory_proportion_by_ipu,
    set_graph_available_memory_proportion_by_ipu,
    remap_grad_info,
)
from .utils import (OrderedDict, WeightsDict, duplicate_items, overrides,  # noqa: F811
                    suffix_graph_name, timer)
from .variable_factory import (
    NamedVariableFactories,
    VariableFactory,
    add_replica_sharded_variable_input,
    add_variable_input,
)


def _git_commit():
    """The short SHA of the git repo enclosing the cwd, or None (no GitPython needed)."""
    import os

    d = os.getcwd()
    while True:
        head = os.path.join(d, ".git", "HEAD")
        if os.path.isfile(head):
            try:
                with open(head) as f:
                    ref = f.read().strip()
                if ref.startswith("ref: "):
                    path = os.path.join(d, ".git", ref[5:])
                    if os.path.isfile(path):
                        with open(path) as f:
                            return f.read().strip()[:7]
                    packed = os.path.join(d, ".git", "packed-refs")
                    if os.path.isfile(packed):
                        with open(packed) as f:
                            for line in f:
                                if line.strip().endswith(ref[5:]):
                                    return line.split()[0][:7]
                    return None
                return ref[:7]
            except OSError:
                return None
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


GIT_COMMIT = _git_commit()

__all__ = [
    "Module", "NamedTensors", "NamedTensorData", "NamedVariableFactories", "VariableFactory",
    "GraphWithNamedArgs", "BoundGraph", "GraphCache", "function", "add_variable_input",
    "add_replica_sharded_variable_input", "create_grad_graph_info", "OrderedDict", "timer",
    "WeightsDict", "DotTree", "to_mapping", "sanitise", "NamedReplicaGrouping",
    "cross_entropy", "cross_entropy_with_grad", "host_load", "host_store", "fp8_amax_scale",
    "autodiff",
    "autodiff_with_accumulation", "recompute_graph", "remap_grad_info", "InputStreams",
    "OutputStreams", "ops", "transforms", "GIT_COMMIT", "remote", "rts", "load_remote_graph",
    "store_remote_graph", "named_buffers", "named_variable_buffers", "create_remote_buffer",
    "TaskSession", "write_variables_pb", "initialise_memmap_dir_from_checkpoint",
    "is_subgraph", "route_tensor_into_graph", "pipelined_execution", "batch_serialise",
    "batch_serialise_fwd_and_grad", "batch_serial_buffer", "RemoteHandle", "disable_fc_pass",
    "enable_fc_pass", "set_available_memory_proportion_by_ipu",
    "set_graph_available_memory_proportion_by_ipu", "seed_variable", "print_tensor", "print_text",
    "evaluate_FLOPs", "evaluate_ir_FLOPs", "total_FLOPs", "print_FLOPs", "format_flops_scientific",
    "debugging", "performance_utils",
    "NameScopeMeta", "add_recompute_inputs", "argument_hash", "bound_arguments",
    "get_function_hash", "tensor_hash",
    # names upstream's `import *` chain leaks into the package namespace
    "Ir", "ReplicaGrouping", "Tensor", "HostTensor", "get_current_context", "ExpectedConnection",
    "ExpectedConnectionType", "GradGraphInfo", "CalledGraphsGradInfo", "CalledGraphsGradInfoLike",
    "GradGraphInfoLike", "GraphLike", "duplicate_items", "overrides", "suffix_graph_name",
    *_am_all,
]
