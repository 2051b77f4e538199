"""popxl-dist: the PopXL API, emulated on NumPy (one process, MPI ranks or Ray actors)."""
from . import dtypes
from .context import (gcg, get_current_graph, get_ir, get_main_graph, gir, gmg, in_sequence,
                      io_tiles, ipu, name_scope)
from .dtypes import (bool, complex64, complex128, double, dtype, float, float8_143, float8_152,
                     float16, float32, float64, half, int8, int16, int32, int64, uint8, uint16,
                     uint32, uint64)
from .tensorlocation import (ExecutionContext, ReplicatedTensorSharding, TensorLocation,
                             TensorStorage, TileSet)
from .graph import Graph
from .ir import Ir
from .module import Module
from .random_seed import create_seeds
from .remote_buffer import (RemoteBuffer, remote_buffer, remote_replica_sharded_variable,
                            remote_variable, replica_sharded_buffer, replica_sharded_variable)
from .replica_grouping import ReplicaGrouping
from .session import Session
from .streams import DeviceToHostStream, HostToDeviceStream, d2h_stream, h2d_stream
from .tensor import (Constant, Tensor, TensorByRef, TensorSpec, Variable, constant, graph_input,
                     graph_output, variable)
from . import transforms  # noqa: E402  (imports ops lazily)
from . import custom_ops  # noqa: E402
from . import debug  # noqa: E402  (popxl-dist's debugging tools: popxl.debug)
from .custom_ops.cppimport_hook import install as _install_cppimport_hook

_install_cppimport_hook()   # C++ custom op bindings resolve to the emulator's implementations

from popart._version import EMULATOR_VERSION as __version__  # noqa: E402  (says emulator)

__all__ = [
    "gcg", "get_current_graph", "get_ir", "get_main_graph", "gir", "gmg", "in_sequence",
    "io_tiles", "ipu", "name_scope", "dtype", "bool", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "half", "float8_143", "float8_152", "float16", "float",
    "float32", "double", "float64", "complex64", "complex128", "Graph", "Ir", "Module",
    "RemoteBuffer", "ReplicaGrouping", "HostToDeviceStream", "DeviceToHostStream", "Tensor",
    "TensorByRef", "TensorSpec", "TensorStorage", "TensorLocation", "ReplicatedTensorSharding",
    "TileSet", "ExecutionContext", "Session", "create_seeds", "remote_buffer", "h2d_stream",
    "d2h_stream", "variable", "remote_variable", "remote_replica_sharded_variable",
    "replica_sharded_variable", "constant", "graph_input", "graph_output",
]
