"""`popart._internal.ir`: the slice of PopART's IR bindings that PopXL programs and
popxl_addons-style code touch, over popxl-dist's IR.

* value types and enums: `GraphId`, `OperatorIdentifier`, `NumInputs`, `ExpectedConnection(Type)`,
  `BwdGraphInfo`, `PrintTensorFmt`, `FloatFormat`, `CodeLocation`, `AdamMode`, `OptimizerValue`,
  `CollectiveOperator`, `CommGroup(Type)`, `TileSet`, `ExecutionContext`, `DataType`,
  `TensorType`, `AccumulationType`, `InitType`, `TensorStorage`, `ReplicatedTensorSharding`,
  `TensorLocation`, the `Optional*` wrappers, `SourceLocation`, `DebugInfo`, `DebugContext`,
  `ProfileValue`, `RemoteBufferInfo`, `ReplicaGrouping`, `Settings` (what `op.settings` is);
* the views `Ir`, `Graph`, `Op`, `Tensor`, `TensorInfo` (what `ir._pb_ir`, `graph._pb_graph`,
  `tensor._pb_tensor` return) and `op`, the op classes for `isinstance` checks
  (`op.CallOp`, `op.MatMulOp`, ... one per op type; `op.collectives.X` is `op.X`);
* `patterns.PatternsLevel` and `patterns.Patterns` (for `ir._pb_ir.setPatterns`).

Importing it imports popxl (it views popxl's IR).
"""
from __future__ import annotations

import sys
import types

from popart._version import EMULATOR_VERSION as __version__  # noqa: F401
from popart._options import (CollectiveOperator, OptimizerValue, PatternsLevel,
                             ReplicatedTensorSharding, TensorLocation, TensorStorage)
from popxl._pb_shim import OpSettings as Settings
from popxl._pb_shim import PbGraph as Graph
from popxl._pb_shim import PbIr as Ir
from popxl._pb_shim import PbOp as Op
from popxl._pb_shim import PbReplicaGrouping as ReplicaGrouping
from popxl._pb_shim import PbTensor as Tensor
from popxl._pb_shim import PbTensorInfo as TensorInfo
from popxl._pb_shim import op_class
from popxl.ops.collectives import CommGroup, CommGroupType
from popxl.tensorlocation import ExecutionContext, TileSet

from ._types import (AccumulationType, AdamMode, AutoPad, BranchInfo, BwdGraphInfo, CodeLocation,
                     DataType, DebugContext, DebugInfo, ExpectedConnection,
                     ExpectedConnectionType, FloatFormat, GraphId, InitType, NumInputs,
                     OperatorIdentifier, OptionalDataType, OptionalFloat, OptionalInt,
                     OptionalInt64Vector, OptionalTensors, OptionalVGraphId, Patterns,
                     PrintTensorFmt, ProfileValue, RemoteBufferInfo, ScatterReduction,
                     SerialiseSettings, SourceLocation, TensorType, VariableUpdateType)

__all__ = ["GraphId", "OperatorIdentifier", "NumInputs", "ExpectedConnection",
           "ExpectedConnectionType", "BwdGraphInfo", "PrintTensorFmt", "FloatFormat",
           "CodeLocation", "AdamMode", "ScatterReduction", "OptimizerValue",
           "CollectiveOperator", "CommGroup", "CommGroupType", "TileSet", "ExecutionContext",
           "DataType", "TensorType", "VariableUpdateType", "AccumulationType", "InitType",
           "TensorStorage", "ReplicatedTensorSharding", "TensorLocation", "OptionalInt",
           "OptionalFloat", "OptionalDataType", "OptionalVGraphId", "OptionalInt64Vector",
           "OptionalTensors", "SourceLocation", "DebugInfo", "DebugContext", "ProfileValue",
           "RemoteBufferInfo", "ReplicaGrouping", "Settings", "Ir", "Graph", "Op", "Tensor",
           "TensorInfo", "op", "patterns"]

# the value types upstream binds in `_ir.op` (the rest of `_ir.op` are op classes)
_OP_VALUES = {"BranchInfo": BranchInfo, "SerialiseSettings": SerialiseSettings,
              "AutoPad": AutoPad, "ScatterReduction": ScatterReduction}


def _op_getattr(name: str):
    if name[:1].islower():             # sub-namespaces (op.collectives, op.exchange, ...)
        return op
    if name in _OP_VALUES:
        return _OP_VALUES[name]
    return op_class(name)


op = types.ModuleType(f"{__name__}.op", "Op classes by name: `op.<OpType>Op`.")
op.__getattr__ = _op_getattr
sys.modules[op.__name__] = op

patterns = types.ModuleType(f"{__name__}.patterns", "Pattern levels.")
patterns.PatternsLevel = PatternsLevel
patterns.Patterns = Patterns
sys.modules[patterns.__name__] = patterns
