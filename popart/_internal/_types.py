"""Plain value types of `popart._internal.ir` that popxl itself builds (no popxl import here)."""
from __future__ import annotations

import enum
from typing import Iterable, List, NamedTuple

__all__ = ["GraphId", "OperatorIdentifier", "ExpectedConnectionType", "ExpectedConnection",
           "BwdGraphInfo", "FloatFormat", "PrintTensorFmt", "CodeLocation", "AdamMode",
           "ScatterReduction"]


class GraphId(str):
    """A graph id (upstream `_ir.GraphId`): compares equal to its string; `.str()` returns it."""

    def str(self) -> str:  # noqa: A003 - upstream's method name
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"GraphId({str.__repr__(self)})"


class OperatorIdentifier(NamedTuple):
    """`domain.type:version` of an op type (upstream `popart.OperatorIdentifier`)."""

    domain: str
    type: str
    version: int

    def __str__(self) -> str:
        return f"{self.domain}.{self.type}:{self.version}"


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
