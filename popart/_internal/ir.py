"""`popart._internal.ir`: the slice of PopART's IR bindings that PopXL programs and
popxl_addons-style code touch, over popxl-dist's IR.

* value types: `GraphId`, `OperatorIdentifier`, `ExpectedConnection(Type)`, `BwdGraphInfo`,
  `PrintTensorFmt`, `FloatFormat`, `CodeLocation`, `AdamMode`, `OptimizerValue`,
  `CollectiveOperator`, `CommGroup(Type)`, `TileSet`, `ExecutionContext`;
* the views `Ir`, `Graph`, `Op`, `Tensor`, `TensorInfo` (what `ir._pb_ir`, `graph._pb_graph`,
  `tensor._pb_tensor` return) and `op`, the op classes for `isinstance` checks
  (`op.CallOp`, `op.MatMulOp`, ... one per op type; `op.collectives.X` is `op.X`);
* `patterns.PatternsLevel`.

Importing it imports popxl (it views popxl's IR).
"""
from __future__ import annotations

import sys
import types

from popart._options import CollectiveOperator, OptimizerValue, PatternsLevel
from popxl._pb_shim import PbGraph as Graph
from popxl._pb_shim import PbIr as Ir
from popxl._pb_shim import PbOp as Op
from popxl._pb_shim import PbTensor as Tensor
from popxl._pb_shim import PbTensorInfo as TensorInfo
from popxl._pb_shim import op_class
from popxl.ops.collectives import CommGroup, CommGroupType
from popxl.tensorlocation import ExecutionContext, TileSet

from ._types import (AdamMode, BwdGraphInfo, CodeLocation, ExpectedConnection,
                     ExpectedConnectionType, FloatFormat, GraphId, OperatorIdentifier,
                     PrintTensorFmt, ScatterReduction)

__all__ = ["GraphId", "OperatorIdentifier", "ExpectedConnection", "ExpectedConnectionType",
           "BwdGraphInfo", "PrintTensorFmt", "FloatFormat", "CodeLocation", "AdamMode",
           "ScatterReduction", "OptimizerValue", "CollectiveOperator", "CommGroup",
           "CommGroupType", "TileSet", "ExecutionContext", "Ir", "Graph", "Op", "Tensor",
           "TensorInfo", "op", "patterns"]


def _op_getattr(name: str):
    if name[:1].islower():             # sub-namespaces (op.collectives, op.exchange, ...)
        return op
    return op_class(name)


op = types.ModuleType(f"{__name__}.op", "Op classes by name: `op.<OpType>Op`.")
op.__getattr__ = _op_getattr
sys.modules[op.__name__] = op

patterns = types.ModuleType(f"{__name__}.patterns", "Pattern levels.")
patterns.PatternsLevel = PatternsLevel
sys.modules[patterns.__name__] = patterns
