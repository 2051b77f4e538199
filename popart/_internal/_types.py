"""Plain value types of `popart._internal.ir` that popxl itself builds (no popxl import here)."""
from __future__ import annotations

import enum
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence

__all__ = ["GraphId", "OperatorIdentifier", "NumInputs", "ExpectedConnectionType",
           "ExpectedConnection", "BwdGraphInfo", "FloatFormat", "PrintTensorFmt", "CodeLocation",
           "AdamMode", "ScatterReduction", "DataType", "TensorType", "VariableUpdateType",
           "AccumulationType", "InitType", "AutoPad", "OptionalInt", "OptionalFloat",
           "OptionalDataType", "OptionalVGraphId", "OptionalInt64Vector", "OptionalTensors",
           "SourceLocation", "DebugInfo", "DebugContext", "ProfileValue", "RemoteBufferInfo",
           "BranchInfo", "SerialiseSettings", "Patterns"]


class GraphId(str):
    """A graph id (upstream `_ir.GraphId`): compares equal to its string; `.str()` returns it."""

    def str(self) -> str:  # noqa: A003 - upstream's method name
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"GraphId({str.__repr__(self)})"


class NumInputs:
    """The allowed number of inputs of an op type (upstream `_ir.NumInputs(min, max)`)."""

    def __init__(self, min: int = 0, max: Optional[int] = None) -> None:  # noqa: A002
        self.min = min
        self.max = min if max is None else max

    def __repr__(self) -> str:
        return f"NumInputs({self.min}, {self.max})"


class OperatorIdentifier(NamedTuple):
    """`domain.type:version` of an op type (upstream `popart.OperatorIdentifier`; upstream's
    constructor also takes the number of inputs and outputs, kept here but not compared)."""

    domain: str
    type: str
    version: int
    numInputs: Optional[NumInputs] = None
    numOutputs: int = 1

    def __str__(self) -> str:
        return f"{self.domain}.{self.type}:{self.version}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OperatorIdentifier):
            return NotImplemented
        return tuple(self[:3]) == tuple(other[:3])

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(tuple(self[:3]))


class ExpectedConnectionType(enum.Enum):
    Fwd = 0
    FwdGrad = 1


class ExpectedConnection:
    """One input or output of a gradient graph: a forward tensor id and what flows through it."""

    def __init__(self, fwdId: str, type: ExpectedConnectionType) -> None:  # noqa: A002
        if not isinstance(type, ExpectedConnectionType):
            raise TypeError(f"ExpectedConnection: type must be an _ir.ExpectedConnectionType, "
                            f"got {type!r}")
        self.fwdId = str(fwdId)
        self.type = type

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ExpectedConnection) and other.fwdId == self.fwdId
                and other.type == self.type)

    def __repr__(self) -> str:
        return f"ExpectedConnection({self.fwdId!r}, {self.type})"


class BwdGraphInfo:
    """A gradient graph's id and its expected connections (upstream `_ir.BwdGraphInfo`)."""

    def __init__(self, bwdGraphId: str, expectedInputs: Iterable[ExpectedConnection],
                 expectedOutputs: Iterable[ExpectedConnection]) -> None:
        self.bwdGraphId = GraphId(bwdGraphId)
        self.expectedInputs: List[ExpectedConnection] = list(expectedInputs)
        self.expectedOutputs: List[ExpectedConnection] = list(expectedOutputs)


class FloatFormat(enum.Enum):
    Auto = 0
    Fixed = 1
    Scientific = 2
    None_ = 3


class PrintTensorFmt:
    """Formatting of a printed tensor (upstream `_ir.PrintTensorFmt`)."""

    def __init__(self, summariseThreshold: int = 1000, edgeItems: int = 3,
                 maxLineWidth: int = 75, digits: int = 8,
                 floatFormat: FloatFormat = FloatFormat.Auto, separator: str = " ",
                 openBracket: str = "[", closeBracket: str = "]") -> None:
        self.summariseThreshold = summariseThreshold
        self.edgeItems = edgeItems
        self.maxLineWidth = maxLineWidth
        self.digits = digits
        self.floatFormat = floatFormat
        self.separator = separator
        self.openBracket = openBracket
        self.closeBracket = closeBracket


class CodeLocation(enum.Enum):
    ExecutableMemory = 0
    Buffer = 1


class AdamMode(enum.Enum):
    """Which updater an AdamUpdater op computes (upstream `_ir.AdamMode`)."""

    Adam = 0
    AdamNoBias = 1
    AdaMax = 2
    Lamb = 3
    LambNoBias = 4


class ScatterReduction(enum.Enum):
    """The reduction of a ScatterReduce op (upstream `_ir.op.ScatterReduction`)."""

    Sum = 0
    Max = 1
    Min = 2
    None_ = 3


class DataType(str, enum.Enum):
    """PopART's data types (upstream `_ir.DataType` / `popart.DataType`). The members are also
    their names as strings (`DataType.FLOAT == "FLOAT"`), which is how the emulator's views
    report tensor types."""

    UINT8 = "UINT8"
    INT8 = "INT8"
    UINT16 = "UINT16"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    BOOL = "BOOL"
    FLOAT = "FLOAT"
    FLOAT16 = "FLOAT16"
    BFLOAT16 = "BFLOAT16"
    FLOAT8_143 = "FLOAT8_143"
    FLOAT8_152 = "FLOAT8_152"
    DOUBLE = "DOUBLE"
    COMPLEX64 = "COMPLEX64"
    COMPLEX128 = "COMPLEX128"
    STRING = "STRING"
    UNDEFINED = "UNDEFINED"

    def __str__(self) -> str:
        return self.value


class TensorType(str, enum.Enum):
    """What a tensor is (upstream `_ir.TensorType`); equal to its name as a string."""

    ActGrad = "ActGrad"
    Const = "Const"
    Stream = "Stream"
    Unknown = "Unknown"
    Variable = "Variable"
    N = "N"

    def __str__(self) -> str:
        return self.value


class VariableUpdateType(enum.Enum):
    None_ = 0
    Gradient = 1
    Copy = 2


class AccumulationType(enum.Enum):
    """The update an Accumulate op makes (upstream `_ir.AccumulationType`)."""

    Add = 0
    DampenedAdd = 1
    DampenedAddSquare = 2
    DecayAdd = 3
    DecayAddSquare = 4
    MovingAverage = 5
    MovingAverageSquare = 6
    Infinity = 7
    Mean = 8


class InitType(enum.Enum):
    NoInit = 0
    Zero = 1


class AutoPad(enum.Enum):
    """Convolution padding modes (upstream `_ir.op.AutoPad`)."""

    NOTSET = 0
    SAME_UPPER = 1
    SAME_LOWER = 2
    VALID = 3


class _Optional:
    """An optional value (upstream's `_ir.Optional*` wrappers): `Optional*()` is empty."""

    def __init__(self, value: Any = None) -> None:
        self._value = value

    def has_value(self) -> bool:
        return self._value is not None

    def value(self) -> Any:
        if self._value is None:
            raise ValueError(f"{type(self).__name__} is empty")
        return self._value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._value == self._value

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self._value)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'' if self._value is None else repr(self._value)})"


class OptionalInt(_Optional):
    pass


class OptionalFloat(_Optional):
    pass


class OptionalDataType(_Optional):
    pass


class OptionalVGraphId(_Optional):
    pass


class OptionalInt64Vector(_Optional):
    def __init__(self, value: Optional[Sequence[int]] = None) -> None:
        super().__init__(None if value is None else [int(v) for v in value])


class OptionalTensors(_Optional):
    pass


class SourceLocation:
    """Where an op was built (upstream `_ir.SourceLocation`)."""

    def __init__(self, functionName: str, fileName: str, lineNumber: int) -> None:
        self.functionName = functionName
        self.fileName = fileName
        self.lineNumber = lineNumber

    def __repr__(self) -> str:
        return f"SourceLocation({self.functionName!r}, {self.fileName!r}, {self.lineNumber})"


class DebugInfo:
    """Debug information of an op or tensor (upstream `_ir.DebugInfo`): a name and a source
    location, plus named values."""

    def __init__(self, debugContext: "DebugContext" = None, layer: str = "popxl") -> None:
        self.debugContext = debugContext
        self.layer = layer
        self.values: Dict[str, Any] = {}

    def setValue(self, name: str, value: Any) -> bool:
        self.values[name] = value
        return True


class DebugContext:
    """The name and source location a debug record is made with (upstream `_ir.DebugContext`)."""

    def __init__(self, name: str = "", location: Optional[SourceLocation] = None) -> None:
        self.name = name
        self.location = location

    def getPathName(self) -> str:
        return self.name


class ProfileValue:
    """A value recorded in debug information (upstream `_ir.ProfileValue`)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"ProfileValue({self.value!r})"


class RemoteBufferInfo:
    """The tensor info and number of entries of a remote buffer (upstream
    `_ir.RemoteBufferInfo`)."""

    def __init__(self, info: Any = None, repeats: int = 1) -> None:
        self.TensorInfo = info
        self.repeats = repeats


class BranchInfo:
    """How a conditional branch connects to the If op (upstream `_ir.op.BranchInfo`): its graph
    id, {op input index: branch input index} and {op output index: branch output index}."""

    def __init__(self, graphId: Any, inputIndicesMap: Dict[int, int],
                 outputIndicesMap: Dict[int, int]) -> None:
        self.graphId = graphId
        self.inputIndicesMap = dict(inputIndicesMap)
        self.outputIndicesMap = dict(outputIndicesMap)


class SerialiseSettings:
    """Matmul serialisation (upstream `_ir.op.SerialiseSettings`): the emulator does not split
    matmuls; the settings are recorded."""

    def __init__(self) -> None:
        self.mode = "None"
        self.factor = 0
        self.keep_precision = False


class Patterns:
    """A set of PopART patterns (upstream `_ir.patterns.Patterns`), built from a
    `PatternsLevel` (or a list of pattern names). Of the pre-alias patterns only OpToIdentity
    changes what a program computes here (see `popxl.transforms.patterns`)."""

    def __init__(self, level: Any = None) -> None:
        from popart._options import PatternsLevel

        if level is None:
            level = PatternsLevel.Default
        if isinstance(level, PatternsLevel):
            self.level = level
            self._names: Optional[List[str]] = None
        elif isinstance(level, (list, tuple)) and all(isinstance(n, str) for n in level):
            self.level = None
            self._names = list(level)
        else:
            raise TypeError(f"Patterns: expected a PatternsLevel or a list of pattern names, got "
                            f"{level!r}")
        self._runtime_asserts = True

    def isPatternEnabled(self, name: str) -> bool:
        """Whether pattern `name` runs: "OpToIdentity" at levels Default and All (or when
        named); other patterns do not change results in the emulator."""
        if self._names is not None:
            return name in self._names
        from popart._options import PatternsLevel

        if name == "OpToIdentity":
            return self.level in (PatternsLevel.Default, PatternsLevel.All)
        return self.level is not PatternsLevel.NoPatterns

    def enableRuntimeAsserts(self, enable: bool) -> "Patterns":
        self._runtime_asserts = bool(enable)
        return self

    def __repr__(self) -> str:
        return f"Patterns({self.level if self._names is None else self._names})"
