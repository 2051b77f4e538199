"""Views of the IR shaped like the PopART objects real programs reach through `ir._pb_ir`,
`graph._pb_graph`, `tensor._pb_tensor`, `session._pb_session` (and op-created hooks).

They are thin: each holds a popxl object (Ir, Graph) plus an id, reads the IR records on every
call, and writes only where upstream's method mutates the IR (`removeOutput`,
`setCanBeRecursivelyAutodiffed`, `topoCons().insert`, `setUseFullyConnectedPass`). Op views are
instances of a class per op type (`_ir.op.MatMulOp`, `_ir.op.CallOp`, ...; see `op_class`), so
`isinstance(op, _ir.op.CallOp)` works as upstream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Union

from popart import SessionOptions
from popart._internal._types import DataType, GraphId, OperatorIdentifier, Patterns, TensorType

from ._ir.records import Op, TensorKind

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir

__all__ = ["PbIr", "PbGraph", "PbOp", "PbTensor", "PbTensorInfo", "PbSession", "TopoCons",
           "PbReplicaGrouping",
           "op_class", "op_view", "SessionOptions"]

# ONNX ops keep their domain and the opset version upstream's builders give them in `op.str()`;
# the rest are Graphcore ops, version 1.
_ONNX_VERSIONS = {
    "Abs": 6, "Add": 6, "And": 7, "ArgMax": 11, "ArgMin": 11, "AveragePool": 11,
    "BatchNormalization": 9, "Cast": 9, "Ceil": 1, "Clip": 6, "Concat": 11, "Conv": 11,
    "ConvTranspose": 11, "Cos": 7, "CumSum": 11, "Div": 7, "Dropout": 10, "Equal": 7, "Exp": 6,
    "Floor": 6, "Gather": 1, "Greater": 9, "Identity": 1, "If": 11, "IsInf": 10, "IsNaN": 9,
    "Log": 6, "Loop": 11, "MatMul": 9, "Max": 6, "MaxPool": 11, "Min": 8, "Mul": 7, "Neg": 6,
    "Not": 1, "OneHot": 9, "Or": 7, "Pow": 7, "RandomNormal": 1, "RandomUniform": 1,
    "ReduceL1": 1, "ReduceL2": 1, "ReduceLogSum": 1, "ReduceLogSumExp": 1, "ReduceMax": 1,
    "ReduceMean": 1, "ReduceMin": 1, "ReduceProd": 1, "ReduceSum": 1, "ReduceSumSquare": 1,
    "Relu": 6, "Reshape": 5, "RoiAlign": 10, "Scatter": 11, "ScatterElements": 11, "Sign": 9,
    "Sin": 7, "Slice": 11, "Softmax": 11, "Split": 2, "Sqrt": 6, "Sub": 7, "Sum": 8, "Tanh": 6,
    "TopK": 1, "Transpose": 1, "Where": 9,
}
# popxl.addons' C++ ops that upstream registers in their own domain
_ADDONS_DOMAIN_TYPES = frozenset({"LinearLayout", "SparseMatmul", "Fp8Scale"})
_SUBGRAPH_TYPES = ("Call", "Loop", "If")

# Where upstream's lowering differs from the emulator's op type: emulator type -> (upstream's
# `opType()`, upstream's `_ir.op` class). Every other type T is upstream's T, class `TOp`.
_UPSTREAM_OPS = {
    "Sub": ("Sub", "SubtractOp"),
    "Neg": ("Neg", "NegateOp"),
    "GroupNormalization": ("GroupNormalization", "GroupNormOp"),
    "GroupNormalizationGrad": ("GroupNormalizationGrad", "GroupNormGradOp"),
    "BatchNormalization": ("BatchNormalization", "BatchNormOp"),
    "BatchNormalizationGrad": ("BatchNormalizationGrad", "BatchNormGradOp"),
    "OneHot": ("OneHot", "OnehotOp"),
    "OneHotGrad": ("OneHotGrad", "OnehotGradOp"),
    "IsInf": ("IsInf", "IsInf"),
    "IsNaN": ("IsNaN", "IsNaN"),
    # upstream has one updater op whose mode says Adam, AdaMax or Lamb
    "AdaMaxUpdater": ("AdamUpdater", "AdamUpdaterOp"),
    "LambUpdater": ("AdamUpdater", "AdamUpdaterOp"),
    "SparseAccumulate": ("PopartSparseAccumulate", "SparseAccumulateOp"),
    "TiedGather": ("PopartTiedGather", "TiedGatherOp"),
    "ScatterValuesGrad": ("ScatterUpdateGrad", "ScatterUpdateGradOp"),
    "ScatterReduceGrad": ("ScatterReduceGradOp", "ScatterReduceGradOp"),
    "ScatterReduceInitGrad": ("ScatterReduceGradOp", "ScatterReduceGradOp"),
    "CrossEntropyShardedWRGrad": ("CrossEntropyShardedGradWR", "CrossEntropyShardedGradWROp"),
    "DenseConstSparseMatMul": ("SparseMatmul", "DenseSparseMatMulOp"),
}
# upstream class name -> upstream op type, for the classes not named `<opType>Op`
_CLASS_TO_TYPE = {cls: up for up, cls in _UPSTREAM_OPS.values()}
_CLASS_TO_TYPE.update({"ReluInplaceOp": "ReluInplace", "IpuCopyOp": "IpuCopy"})


def upstream_op_type(op_type: str) -> str:
    """The `opType()` upstream's lowering gives an op of the emulator's type `op_type`."""
    up = _UPSTREAM_OPS.get(op_type)
    return up[0] if up is not None else op_type


def operator_identifier(op_type: str) -> OperatorIdentifier:
    """`domain.type:version` of an op of the emulator's type `op_type`, as upstream's."""
    t = upstream_op_type(op_type)
    if t in _ONNX_VERSIONS:
        return OperatorIdentifier("ai.onnx", t, _ONNX_VERSIONS[t])
    if t in _ADDONS_DOMAIN_TYPES:
        return OperatorIdentifier("popxl.addons.ops", t, 1)
    return OperatorIdentifier("ai.graphcore", t, 1)


# --- tensors -------------------------------------------------------------------------------
class PbTensorInfo:
    """Shape and data type of a tensor (upstream `_ir.TensorInfo`)."""

    def __init__(self, info) -> None:
        self._info = info

    def shape(self) -> List[int]:
        return list(self._info.shape)

    def metaShape(self) -> List[int]:
        return list(self._info.meta_shape)

    def dataType(self) -> DataType:
        """The data type as PopART's `DataType` (FLOAT, FLOAT16, INT32, ...; equal to its name
        as a string)."""
        return DataType(self._info.dtype._pb_dtype)

    def nelms(self) -> int:
        return self._info.nelms

    def rank(self) -> int:
        return len(self._info.shape)

    def data_type_lcase(self) -> str:
        """The data type's name in lower case ("float", "float16", "int32" ...)."""
        return str(self.dataType()).lower()

    def __repr__(self) -> str:
        return f"{{shape: {self.shape()}, type: {self.dataType()}}}"


_TENSOR_TYPES = {TensorKind.VARIABLE: "Variable", TensorKind.CONSTANT: "Const",
                 TensorKind.STREAM: "Stream"}


class PbTensor:
    """A tensor of a graph (upstream `_ir.Tensor`)."""

    def __init__(self, graph: "Graph", tid: str) -> None:
        self._graph = graph
        self.id = tid

    @property
    def _info(self):
        return self._graph._data.tensors[self.id]

    @property
    def info(self) -> PbTensorInfo:
        return PbTensorInfo(self._info)

    def tensorType(self) -> TensorType:
        """`TensorType.ActGrad` for op outputs and graph inputs, else Variable, Const or Stream
        (equal to their names as strings)."""
        return TensorType(_TENSOR_TYPES.get(self._info.kind, "ActGrad"))

    def getGraph(self) -> "PbGraph":
        return PbGraph(self._graph)

    def getIr(self) -> "PbIr":
        return PbIr(self._graph.ir)

    def isAliased(self) -> bool:
        """Whether an op's output aliases this tensor: an in-place op writing it (output 0 is
        its input 0) or a view op of upstream's reshape_ / transpose_ family."""
        from .engine.kernels import load_all
        from .engine.kernels.registry import spec_of

        load_all()
        for op in self._graph._data.ops:
            if not op.inputs or op.inputs[0] != self.id:
                continue
            spec = spec_of(op)
            if spec is not None and (spec.alias or (
                    spec.returns_input and 0 in spec.modified_inputs(op))):
                return True
        return False

    def hasTensorData(self) -> bool:
        """Whether the tensor holds data at graph-construction time (constants, variables)."""
        return self._info.data is not None

    def hasProducer(self) -> bool:
        return self.id in self._graph._data.producer

    def getProducer(self) -> "PbOp":
        op = self._graph._data.producer.get(self.id)
        if op is None:
            raise ValueError(f"Tensor '{self.id}' has no producer")
        return op_view(self._graph, op)

    def getConsumers(self) -> List["PbOp"]:
        return [op_view(self._graph, op) for op in self._graph._data.ops if self.id in op.inputs]

    def isGraphInput(self) -> bool:
        return self.id in self._graph._data.inputs

    def isGraphOutput(self) -> bool:
        return self.id in self._graph._data.outputs

    def getGraphInputIndex(self) -> int:
        return self._graph._data.inputs.index(self.id)

    def getGraphOutputIndex(self) -> int:
        return self._graph._data.outputs.index(self.id)

    def str(self) -> str:  # noqa: A003 - upstream's method name
        return self.id

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PbTensor) and other.id == self.id
                and other._graph._data is self._graph._data)

    def __hash__(self) -> int:
        return hash((self.id, id(self._graph._data)))

    def __repr__(self) -> str:
        return f"PbTensor({self.id!r})"


# --- ops -----------------------------------------------------------------------------------
class OpSettings:
    """An op's placement settings (upstream `_ir.Settings`)."""

    def __init__(self, op: Op) -> None:
        from .tensorlocation import ExecutionContext, TileSet

        self.name = op.name
        self.vgraphId = op.ipu
        self.tileSet = TileSet.IO if op.tile_set == "io" else TileSet.Compute
        self.executionContext = ExecutionContext[op.exec_ctx]


# Op types whose upstream ops answer `isOptimizerOp()` with true (VarUpdateOp subclasses, the
# Adam-family updater and LAMB's square).
_OPTIMIZER_OP_TYPES = frozenset({"Accumulate", "AccumulatorScale", "SparseAccumulate",
                                 "CopyVarUpdate", "AdamVarUpdate", "AdamUpdater", "LambUpdater",
                                 "AdaMaxUpdater", "LambSquare"})


class PbOp:
    """An op of a graph (upstream `_ir.Op`); `op_view` picks the subclass of its type."""

    def __init__(self, graph: "Graph", op: Op) -> None:
        self._graph = graph
        self._op = op

    @property
    def id(self) -> int:
        return self._op.id

    @property
    def opid(self) -> OperatorIdentifier:
        custom = self._op.attrs.get("__custom_op__")     # popxl.custom_ops: its own domain
        if custom is not None:
            return OperatorIdentifier(custom.domain, custom.op_type, custom.version)
        return operator_identifier(self._op.type)

    @property
    def settings(self) -> OpSettings:
        return OpSettings(self._op)

    def getSettings(self) -> OpSettings:
        return OpSettings(self._op)

    def isOptimizerOp(self) -> bool:
        """Whether upstream counts the op as an optimizer op (the variable updates and the
        Adam / LAMB updaters)."""
        return self._op.type in _OPTIMIZER_OP_TYPES

    def getFactor(self):
        """An accumulate op's factor as a `popart.OptimizerValue` (0.0 and not constant when
        it is a tensor input)."""
        from popart import OptimizerValue

        attrs = self._op.attrs
        if "f" not in attrs:
            raise AttributeError(f"op {self._op.type} has no factor")
        tensor = bool(attrs.get("f_tensor"))
        return OptimizerValue(0.0 if tensor or attrs["f"] is None else attrs["f"], not tensor)

    def getAxis(self) -> int:
        """The axis attribute of ops that have one (e.g. SparseAccumulate)."""
        if "axis" not in self._op.attrs:
            raise AttributeError(f"op {self._op.type} has no axis")
        return self._op.attrs["axis"]

    def opType(self) -> str:
        """The op type as upstream names it (e.g. "Sub", "GroupNormalization", "AdamUpdater")."""
        return upstream_op_type(self._op.type)

    def modifiesIndex(self, index: int) -> bool:
        """Whether the op writes input `index` in place (in-place ops, and calls / loops whose
        callee modifies that input)."""
        from ._ir.surgery import modified_inputs

        if self._op.type == "Loop":     # upstream's LoopOp inputs start with M and cond
            index -= 2
        return index >= 0 and index in modified_inputs(self._graph.ir._data.graphs, self._op)

    def getName(self) -> str:
        return self._op.name

    name = getName

    def str(self) -> str:  # noqa: A003 - upstream's method name
        return f"{self._op.id} ({self.opid})"

    def debugName(self) -> str:
        sub = ""
        if self._op.called:
            parts = []
            for gid in self._op.called:
                gd = self._graph.ir._data.graphs[gid]
                parts.append(f"{gid}({', '.join(gd.inputs)}; {', '.join(gd.outputs)})")
            sub = f"subgraphs=[{', '.join(parts)}], "
        return (f"Op({self._op.name} ({self.opid}), {sub}inputs=[{', '.join(self._op.inputs)}], "
                f"outputs=[{', '.join(self._op.outputs)}])")

    def getGraph(self) -> "PbGraph":
        return PbGraph(self._graph)

    def getIr(self) -> "PbIr":
        return PbIr(self._graph.ir)

    def getInputTensors(self) -> List[PbTensor]:
        return [PbTensor(self._graph, t) for t in self._op.inputs]

    def getOutputTensors(self) -> List[PbTensor]:
        return [PbTensor(self._graph, t) for t in self._op.outputs]

    def inTensor(self, index: int) -> PbTensor:
        return PbTensor(self._graph, self._op.inputs[index])

    def outTensor(self, index: int) -> PbTensor:
        return PbTensor(self._graph, self._op.outputs[index])

    def inId(self, index: int) -> str:
        return self._op.inputs[index]

    def outId(self, index: int) -> str:
        return self._op.outputs[index]

    def inTensorCount(self) -> int:
        return len(self._op.inputs)

    def outTensorCount(self) -> int:
        return len(self._op.outputs)

    def hasInput(self, index: int) -> bool:
        return 0 <= index < len(self._op.inputs)

    def hasOutput(self, index: int) -> bool:
        return 0 <= index < len(self._op.outputs)

    def getCalledGraphs(self) -> List["PbGraph"]:
        return [PbGraph(self._graph.ir._graph(g)) for g in self._op.called]

    def getVirtualGraphId(self) -> int:
        return self._op.ipu

    def hasVirtualGraphId(self) -> bool:
        return self._op.ipu is not None

    def useFullyConnectedPass(self) -> bool:
        return bool(self._op.attrs.get("use_fully_connected_pass", True))

    def setUseFullyConnectedPass(self, use: bool) -> None:
        self._op.attrs["use_fully_connected_pass"] = bool(use)

    def __getattr__(self, name: str):
        # The emulator's record fields (type, inputs, outputs, attrs, called, ipu, exec_ctx)
        # are readable on the view too, for code written against popxl-dist's IR.
        if name.startswith("__") or name == "_op":
            raise AttributeError(name)
        return getattr(self._op, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PbOp) and other._op is self._op

    def __hash__(self) -> int:
        return hash(id(self._op))

    def __repr__(self) -> str:
        return self.str()


class SubgraphOp(PbOp):
    """Call, Loop and If ops (upstream `_ir.op.SubgraphOp`)."""

    def getCalledGraph(self) -> "PbGraph":
        return self.getCalledGraphs()[0]


_OP_CLASSES: Dict[str, type] = {"SubgraphOp": SubgraphOp, "Op": PbOp}


def op_class(name: str) -> type:
    """The view class `_ir.op.<name>` (e.g. "CallOp", "MatMulOp", "SubtractOp"), created on
    first use."""
    cls = _OP_CLASSES.get(name)
    if cls is None:
        if name not in _CLASS_TO_TYPE and (not name.endswith("Op") or not name[:-2]):
            raise AttributeError(f"popart._internal.ir.op has no attribute '{name}' (op classes "
                                 f"are named <OpType>Op, e.g. MatMulOp)")
        op_type = _CLASS_TO_TYPE.get(name, name[:-2])
        base = SubgraphOp if op_type in _SUBGRAPH_TYPES else PbOp
        cls = type(name, (base,), {"__doc__": f"Ops of type `{op_type}`.", "_op_type": op_type,
                                   "__module__": "popart._internal.ir.op"})
        _OP_CLASSES[name] = cls
    return cls


def op_view(graph: "Graph", op: Op) -> PbOp:
    """The upstream-shaped view of `op` (an instance of its upstream class, `_ir.op.<Type>Op`
    for most types)."""
    up = _UPSTREAM_OPS.get(op.type)
    return op_class(up[1] if up is not None else f"{op.type}Op")(graph, op)


# --- graphs --------------------------------------------------------------------------------
class TopoCons:
    """Scheduling constraints of a graph (upstream `_ir.TopoCons`). The emulator runs ops in
    creation order; constraints are recorded (and checked against that order on insert)."""

    def __init__(self, graph: "Graph") -> None:
        self._graph = graph

    def insert(self, before: PbOp, after: PbOp, tied: bool = False) -> None:
        ops = self._graph._data.ops
        if ops.index(before._op) > ops.index(after._op):
            raise NotImplementedError(
                f"topoCons().insert: op {before.str()} must run before {after.str()}, but it "
                f"was created after it; the emulator executes ops in creation order")
        self._graph._data.topo_cons.append((before.id, after.id, bool(tied)))

    def contains(self, before: PbOp, after: PbOp) -> bool:
        return any(b == before.id and a == after.id for b, a, _ in self._graph._data.topo_cons)

    def getAfters(self, op: PbOp) -> List[PbOp]:
        ids = {a for b, a, _ in self._graph._data.topo_cons if b == op.id}
        return [op_view(self._graph, o) for o in self._graph._data.ops if o.id in ids]

    def getBefores(self, op: PbOp) -> List[PbOp]:
        ids = {b for b, a, _ in self._graph._data.topo_cons if a == op.id}
        return [op_view(self._graph, o) for o in self._graph._data.ops if o.id in ids]


class PbGraph:
    """A graph of the IR (upstream `_ir.Graph`)."""

    def __init__(self, graph: "Graph") -> None:
        self._graph = graph

    def __contains__(self, tensor_id: str) -> bool:
        """Whether the graph has a tensor of this id (upstream: `id in graph`)."""
        return str(tensor_id) in self._graph._data.tensors

    @property
    def id(self) -> GraphId:
        return GraphId(self._graph.id)

    def getIr(self) -> "PbIr":
        return PbIr(self._graph.ir)

    def getOps(self) -> List[PbOp]:
        return [op_view(self._graph, op) for op in self._graph._data.ops]

    def getOpSchedule(self, require_optimal: bool = True) -> List[PbOp]:
        """Creation order: a valid schedule, and the one the emulator runs."""
        return self.getOps()

    def getOp(self, op_id: int) -> PbOp:
        for op in self._graph._data.ops:
            if op.id == op_id:
                return op_view(self._graph, op)
        raise KeyError(f"Graph '{self._graph.id}' has no op with id {op_id}")

    def getInputIds(self) -> List[str]:
        return list(self._graph._data.inputs)

    def getOutputIds(self) -> List[str]:
        return list(self._graph._data.outputs)

    def getInputId(self, index: int) -> str:
        return self._graph._data.inputs[index]

    def getOutputId(self, index: int) -> str:
        return self._graph._data.outputs[index]

    def getInputIndex(self, tensor_id: str) -> int:
        return self._graph._data.inputs.index(tensor_id)

    def getOutputIndex(self, tensor_id: str) -> int:
        return self._graph._data.outputs.index(tensor_id)

    def getInputTensor(self, index: int) -> PbTensor:
        return PbTensor(self._graph, self._graph._data.inputs[index])

    def getOutputTensor(self, index: int) -> PbTensor:
        return PbTensor(self._graph, self._graph._data.outputs[index])

    def getTensor(self, tensor_id: str) -> PbTensor:
        if tensor_id not in self._graph._data.tensors:
            raise KeyError(f"Graph '{self._graph.id}' has no tensor '{tensor_id}'")
        return PbTensor(self._graph, tensor_id)

    def getTensorIds(self) -> List[str]:
        return list(self._graph._data.tensors)

    def getCalledGraphs(self) -> List["PbGraph"]:
        return [PbGraph(g) for g in self._graph.called_graphs]

    def topoCons(self) -> TopoCons:
        return TopoCons(self._graph)

    def setCanBeRecursivelyAutodiffed(self, can: bool) -> None:
        self._graph._data.no_recursive_autodiff = not can

    def canBeRecursivelyAutodiffed(self) -> bool:
        return not self._graph._data.no_recursive_autodiff

    def removeOutput(self, index_or_id: Union[int, str]) -> None:
        outs = self._graph._data.outputs
        if isinstance(index_or_id, str):
            index_or_id = outs.index(index_or_id)
        del outs[index_or_id]

    def markAsOutput(self, tensor_id: str) -> None:
        if tensor_id not in self._graph._data.tensors:
            raise KeyError(f"Graph '{self._graph.id}' has no tensor '{tensor_id}'")
        self._graph._data.outputs.append(tensor_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PbGraph) and other._graph == self._graph

    def __hash__(self) -> int:
        return hash(self._graph)

    def __repr__(self) -> str:
        return f"PbGraph({self._graph.id!r})"


class PbIr:
    """The IR (upstream `_ir.Ir`)."""

    def __init__(self, ir: "Ir") -> None:
        self._ir = ir

    def getSessionOptions(self) -> SessionOptions:
        return self._ir._session_opts()

    def setPatterns(self, patterns: Patterns) -> None:
        """The patterns `applyPreAliasPatterns` applies (upstream `Ir.setPatterns`)."""
        if not isinstance(patterns, Patterns):
            raise TypeError(f"setPatterns: expected a popart._internal.ir.patterns.Patterns, got "
                            f"{type(patterns).__name__}")
        self._ir._patterns = patterns

    def getPatterns(self) -> Patterns:
        patterns = getattr(self._ir, "_patterns", None)
        if patterns is None:
            patterns = self._ir._patterns = Patterns()
        return patterns

    def applyPreAliasPatterns(self, graph: "PbGraph") -> None:
        """Apply the pre-alias patterns of `getPatterns()` to `graph`: OpToIdentity (the
        `*_identical_inputs` all-reduces become identities) when it is enabled; the other
        pre-alias patterns do not change what the emulator computes."""
        from .transforms.patterns import apply_pre_alias_patterns

        if self.getPatterns().isPatternEnabled("OpToIdentity"):
            apply_pre_alias_patterns(graph._graph, "default")

    def applyInplacePattern(self, graph: "PbGraph") -> None:
        """Upstream replaces ops by their in-place variants where that is safe; the emulator's
        results and memory plan do not depend on it, so the graph is left as it is."""
        if not isinstance(graph, PbGraph):
            raise TypeError(f"applyInplacePattern: expected a graph view, got "
                            f"{type(graph).__name__}")

    def getAllGraphs(self) -> List[PbGraph]:
        return [PbGraph(self._ir._graph(g)) for g in self._ir._data.graphs]

    def getMainGraph(self) -> PbGraph:
        return PbGraph(self._ir.main_graph)

    def getGraph(self, graph_id: str) -> PbGraph:
        if graph_id not in self._ir._data.graphs:
            raise KeyError(f"The Ir has no graph '{graph_id}'")
        return PbGraph(self._ir._graph(graph_id))

    def hasGraph(self, graph_id: str) -> bool:
        return graph_id in self._ir._data.graphs

    def logIr(self) -> None:
        """Log every graph's ops on PopART's "ir" logger at DEBUG level, as upstream."""
        from popart import getLogger

        log = getLogger("ir")
        log.debug("Logging the IR:")
        for gid, gd in self._ir._data.graphs.items():
            log.debug(f"Graph '{gid}': " + "; ".join(op.describe() for op in gd.ops))
        log.debug("End IR")

    def getId(self) -> int:
        return self._ir.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PbIr) and other._ir is self._ir

    def __hash__(self) -> int:
        return hash(self._ir)


class PbSession:
    """The session's device interface (upstream `popart._InferenceSessionCore`): weight I/O by
    tensor id, as `popxl_addons.task_session.write_variables_pb` uses it."""

    def __init__(self, session) -> None:
        self._session = session

    def _variable(self, tid: str):
        info = self._session._variables.get(tid)
        if info is None:
            raise KeyError(f"_pb_session: '{tid}' is not a variable of the session's Ir")
        return self._session.ir.main_graph._tensor(tid)

    def writeWeights(self, weightsIo) -> None:
        """Set the host copies of the variables in `weightsIo` (a `popart.PyWeightsIO`); the
        device is updated by `weightsFromHost()`."""
        data = {self._variable(tid): arr for tid, arr in weightsIo.weights.items()}
        self._session._write_host_weights(data)

    def readWeights(self, weightsIo) -> None:
        """Copy the host values of the variables into `weightsIo`'s arrays."""
        for tid, arr in weightsIo.weights.items():
            arr[...] = self._session._host_weights[self._variable(tid).id]

    def weightsFromHost(self) -> None:
        self._session.weights_from_host()

    def weightsToHost(self) -> None:
        self._session.weights_to_host()

    def getIr(self) -> PbIr:
        return PbIr(self._session.ir)



# --- replica groupings ---------------------------------------------------------------------
class PbReplicaGrouping:
    """A constant-stride grouping as upstream's `_ir.ReplicaGrouping`."""

    def __init__(self, num_replicas: int, stride: int, group_size: int) -> None:
        self._n, self._stride, self._size = num_replicas, stride, group_size

    def getNumReplicas(self) -> int:
        return self._n

    def getStride(self) -> int:
        return self._stride

    def getGroupSize(self) -> int:
        return self._size

    def getNumGroups(self) -> int:
        return self._n // self._size

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PbReplicaGrouping)
                and (other._n, other._stride, other._size) == (self._n, self._stride, self._size))

    def __repr__(self) -> str:
        return (f"ReplicaGrouping(numReplicas={self._n}, stride={self._stride}, "
                f"groupSize={self._size})")

