"""The IR as plain, picklable data: IrData -> GraphData -> Op and TensorInfo.

Nothing here computes or knows about the public API; builders in `popxl_dist.ops` append records,
transforms rewrite them, and the engine compiles them. Everything pickles, so an IR can be shipped
to worker processes.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..dtypes import dtype
from .debug import DebugOptions

__all__ = ["TensorInfo", "Op", "GraphData", "IrData", "TensorKind"]


class TensorKind:
    """What a tensor is: where its value comes from."""

    INTERMEDIATE = "intermediate"   # produced by an op
    INPUT = "input"                 # graph input
    VARIABLE = "variable"           # persistent device state, main graph only
    CONSTANT = "constant"           # value folded into the program
    STREAM = "stream"               # host stream handle, main graph only (never a value)


class TensorInfo:
    """Static description of one tensor of one graph."""

    __slots__ = ("id", "shape", "dtype", "meta_shape", "kind", "data", "extra")

    def __init__(self, id: str, shape: Tuple[int, ...], dtype: dtype, kind: str,
                 meta_shape: Tuple[int, ...] = (), data: Optional[np.ndarray] = None,
                 extra: Optional[Dict[str, Any]] = None):
        self.id = id
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.meta_shape = tuple(meta_shape)
        self.kind = kind
        self.data = data
        self.extra = extra if extra is not None else {}

    @property
    def nelms(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)

    def __repr__(self) -> str:
        return f"TensorInfo({self.id!r}, {self.shape}, {self.dtype.name}, {self.kind})"


class Op:
    """One operation: a type string as upstream prints it, an IR-wide id and its connections."""

    __slots__ = ("type", "id", "name", "inputs", "outputs", "attrs", "called", "ipu", "tile_set",
                 "exec_ctx", "debug", "origin")

    def __init__(self, type: str, id: int, name: str, inputs: Tuple[str, ...],
                 outputs: Tuple[str, ...], attrs: Dict[str, Any], called: Tuple[str, ...] = (),
                 ipu: int = 0, tile_set: str = "compute", exec_ctx: str = "Normal",
                 debug: str = "", origin: str = ""):
        self.type = type
        self.id = id
        self.name = name
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attrs = attrs
        self.called = tuple(called)
        self.ipu = ipu
        self.tile_set = tile_set
        self.exec_ctx = exec_ctx
        self.debug = debug
        # For an op autodiff made: the forward op it differentiates (`describe()` of that op)
        self.origin = origin

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)
        if len(state) < len(self.__slots__):
            self.origin = ""

    # Planning hints set by popxl_addons' transforms, read back as upstream's ops report them
    # (no effect on the numbers).
    def useFullyConnectedPass(self) -> bool:
        return bool(self.attrs.get("use_fully_connected_pass", True))

    def getAvailableMemoryProportion(self) -> float:
        return float(self.attrs.get("available_memory_proportion", 0.6))

    def describe(self) -> str:
        """`<type>.<id> '<name>'` plus where the user built it: for error messages."""
        where = f" (built at {self.debug})" if self.debug else ""
        return f"{self.type}.{self.id} '{self.name}'{where}"

    def __repr__(self) -> str:
        return f"Op({self.type}.{self.id}, in={self.inputs}, out={self.outputs})"


class GraphData:
    """Ops in creation order (a valid schedule), tensors by id, inputs and outputs in order."""

    __slots__ = ("id", "ops", "tensors", "inputs", "outputs", "by_ref_inputs", "producer",
                 "no_recursive_autodiff", "topo_cons")

    def __init__(self, id: str):
        self.id = id
        self.ops: List[Op] = []
        self.tensors: Dict[str, TensorInfo] = {}
        self.inputs: List[str] = []
        self.outputs: List[str] = []
        self.by_ref_inputs: set = set()
        self.producer: Dict[str, Op] = {}
        self.no_recursive_autodiff = False
        # (before op id, after op id, tied): recorded scheduling constraints (`in_sequence`,
        # `_pb_graph.topoCons()`); creation order, which the engine runs, satisfies them.
        self.topo_cons: List[Tuple[int, int, bool]] = []

    def add_op(self, op: Op) -> None:
        self.ops.append(op)
        for o in op.outputs:
            self.producer[o] = op

    def remove_op(self, op: Op) -> None:
        self.ops.remove(op)
        for o in op.outputs:
            if self.producer.get(o) is op:
                del self.producer[o]

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)


class IrData:
    """The whole program: graphs by id plus IR-wide counters and settings."""

    def __init__(self, ir_id: int):
        self.ir_id = ir_id
        self.graphs: Dict[str, GraphData] = {"": GraphData("")}
        self.next_op_id = 100
        self.next_graph_index = 0
        self.next_tensor_suffix = 0
        self.next_remote_buffer_id = 1
        self.replication_factor = 1
        self.num_host_transfers = 1
        # `Ir(replication="popdist")`: this process's InstancePlacement (None otherwise)
        self.instance = None
        # remote buffer id -> (shape, dtype, entries, meta_shape)
        self.remote_buffers: Dict[int, Dict[str, Any]] = {}
        # SessionOptions.enableFloatingPointChecks when the Session was created: overflow,
        # division by zero and invalid operations raise instead of giving inf / NaN
        self.floating_point_checks = False
        # SessionOptions.throwIfLog2ScaleTensorNotInRange when the Session was created: a float8
        # op's log2 scale outside [-32, 32) raises (a Poplar runtime error upstream)
        self.log2_scale_checks = True
        # What the Session watches while it runs (NaN origins, replica checks, recording):
        # a DebugOptions set when the Session is created (see `_ir/debug.py`)
        self.debug = DebugOptions()

    @property
    def main(self) -> GraphData:
        return self.graphs[""]

    def new_op_id(self) -> int:
        i = self.next_op_id
        self.next_op_id += 1
        return i

    def new_graph_index(self) -> int:
        i = self.next_graph_index
        self.next_graph_index += 1
        return i

    def unique_tensor_id(self, graph: GraphData, wanted: str) -> str:
        """`wanted`, or `wanted__t<k>` with an IR-wide k if the graph already has it."""
        if wanted not in graph.tensors:
            return wanted
        while True:
            cand = f"{wanted}__t{self.next_tensor_suffix}"
            self.next_tensor_suffix += 1
            if cand not in graph.tensors:
                return cand
