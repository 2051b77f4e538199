"""The emulator's `popart`: what PopXL programs touch of PopART at import time and in error
handling.

PopXL is built on PopART; programs reach it for its exceptions (`except popart.popart_exception`),
its version, `SessionOptions` (via `ir._pb_ir.getSessionOptions()`) and the enums those options
take. This package provides exactly those, plus `popart._internal.ir`, the small view of the IR
that popxl_addons-style code inspects (op classes for `isinstance`, graph ids, expected
connections), `DataType` and a `DeviceManager` whose devices are all the emulator. It is not
PopART: there is no ONNX builder;
`InferenceSession` / `TrainingSession` exist so that programs importing them load, and raise
NotImplementedError when constructed: `popxl.Session` runs programs.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ._device import (DeviceConnectionType, DeviceInfo, DeviceManager, DeviceSelectionCriterion,
                      DeviceType, SyncPattern)
from ._internal._types import DataType
from ._logging import Logger, getLogger
from ._errors import (OutOfMemoryException, popart_exception, popart_internal_exception,
                      poplar_application_runtime_error, poplar_exception,
                      poplar_recoverable_runtime_error, poplar_runtime_error,
                      poplar_unrecoverable_runtime_error, poplibs_exception)
from ._options import (AccumulateOuterFragmentSchedule, AccumulateOuterFragmentSettings,
                       CollectiveOperator, DotCheck, ExecutionPhaseSchedule, Instrumentation,
                       MeanReductionStrategy, MergeVarUpdateType, OptimizerValue, PatternsLevel,
                       PyWeightsIO, RecomputationType, ReductionType, ReplicatedTensorSharding,
                       SessionOptions, SyntheticDataMode, TensorLocation, TensorLocationSettings,
                       TensorStorage, VirtualGraphMode)
from ._variable_settings import VariableRetrievalMode, VariableSettings

__all__ = [
    "versionString", "versionNumber", "packageHash", "popart_exception",
    "popart_internal_exception", "poplar_exception", "poplibs_exception", "poplar_runtime_error",
    "poplar_application_runtime_error", "poplar_recoverable_runtime_error",
    "poplar_unrecoverable_runtime_error", "OutOfMemoryException", "SessionOptions",
    "VirtualGraphMode", "RecomputationType", "SyntheticDataMode", "ReductionType",
    "MergeVarUpdateType", "TensorStorage", "ReplicatedTensorSharding",
    "AccumulateOuterFragmentSchedule", "AccumulateOuterFragmentSettings",
    "ExecutionPhaseSchedule", "MeanReductionStrategy", "Instrumentation", "DotCheck",
    "PatternsLevel", "CollectiveOperator", "TensorLocation", "TensorLocationSettings",
    "OptimizerValue", "PyWeightsIO", "DeviceInfo", "DeviceType", "DeviceManager", "SyncPattern",
    "DeviceConnectionType", "DeviceSelectionCriterion", "CommGroup", "CommGroupType",
    "TileSet", "ExecutionContext", "VariableSettings", "VariableRetrievalMode", "DataType",
    "InferenceSession", "TrainingSession", "getLogger", "Logger",
]

# The PopART release whose PopXL API the emulator follows (see the references).
from ._version import EMULATOR_VERSION as __version__, UPSTREAM_VERSION as _UPSTREAM_VERSION  # noqa: E402


class VersionNumber(NamedTuple):
    major: int
    minor: int
    point: int


def versionString() -> str:
    """The PopART version this emulator follows, e.g. "3.4.0"."""
    return ".".join(map(str, _UPSTREAM_VERSION))


def versionNumber() -> VersionNumber:
    """`versionString()` as numbers (`.major`, `.minor`, `.point`)."""
    return VersionNumber(*_UPSTREAM_VERSION)


def packageHash() -> str:
    """Upstream returns the PopART build's git hash; here it names the emulator."""
    return "popxl-dist"


class _OnnxSession:
    """PopART's ONNX sessions are not part of the emulator (it runs PopXL programs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"popart.{type(self).__name__}: popxl-dist emulates PopXL programs, which run with "
            f"popxl.Session; PopART's ONNX sessions (popart.Builder models) are not emulated")

    @classmethod
    def createFromOnnxModel(cls, *args: Any, **kwargs: Any) -> "_OnnxSession":
        return cls(*args, **kwargs)


class InferenceSession(_OnnxSession):
    """Upstream `popart.InferenceSession` (an ONNX model's inference session): not emulated."""


class TrainingSession(_OnnxSession):
    """Upstream `popart.TrainingSession` (an ONNX model's training session): not emulated."""


# Classes popxl defines and PopART exports too: resolved on first use so that importing popart
# never imports popxl (popxl imports popart for its exceptions).
_FROM_POPXL = {"CommGroup": "popxl.ops.collectives", "CommGroupType": "popxl.ops.collectives",
               "TileSet": "popxl.tensorlocation", "ExecutionContext": "popxl.tensorlocation"}


def __getattr__(name: str) -> Any:
    if name in _FROM_POPXL:
        import importlib

        return getattr(importlib.import_module(_FROM_POPXL[name]), name)
    raise AttributeError(f"module 'popart' has no attribute '{name}' (popxl-dist's popart "
                         f"provides only what PopXL programs use; see popart.__doc__)")
