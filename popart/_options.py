"""`popart.SessionOptions`, the enums its fields take, and the small value classes programs pass to
PopART (`OptimizerValue`, `PyWeightsIO`, tensor location settings).

No option changes what the emulator computes (there is no Poplar compilation, tile memory or
host-device link to tune); the object records what programs set, with upstream's defaults, and
refuses unknown option names with upstream's `AttributeError`.
"""
from __future__ import annotations

import os

import enum
from typing import Any, Dict, Mapping

import numpy as np

__all__ = ["VirtualGraphMode", "RecomputationType", "SyntheticDataMode", "ReductionType",
           "MergeVarUpdateType", "TensorStorage", "ReplicatedTensorSharding",
           "AccumulateOuterFragmentSchedule", "ExecutionPhaseSchedule", "MeanReductionStrategy",
           "Instrumentation", "DotCheck", "PatternsLevel", "CollectiveOperator",
           "TensorLocation", "TensorLocationSettings", "AccumulateOuterFragmentSettings",
           "SessionOptions", "OptimizerValue", "PyWeightsIO"]


class VirtualGraphMode(enum.Enum):
    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3
    N = 4


class RecomputationType(enum.Enum):
    Undefined = 0
    NoRecompute = 1
    Standard = 2
    NormOnly = 3
    RecomputeAll = 4
    Pipeline = 5
    N = 6


class SyntheticDataMode(enum.Enum):
    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3
    N = 4


class ReductionType(enum.Enum):
    Sum = 0
    Mean = 1
    NoReduction = 2
    N = 3


class MergeVarUpdateType(enum.Enum):
    Off = 0          # PopART's `None` (a Python keyword)
    All = 1
    AutoLoose = 2
    AutoTight = 3
    N = 4


class TensorStorage(enum.Enum):
    OnChip = 0
    OffChip = 1
    N = 2


class ReplicatedTensorSharding(enum.Enum):
    Off = 0
    On = 1


class AccumulateOuterFragmentSchedule(enum.Enum):
    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class ExecutionPhaseSchedule(enum.Enum):
    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


class MeanReductionStrategy(enum.Enum):
    Running = 0
    Post = 1
    PostAndLoss = 2
    N = 3


class Instrumentation(enum.Enum):
    Outer = 0
    Inner = 1
    N = 2


class DotCheck(enum.Enum):
    Fwd0 = 0
    Fwd1 = 1
    Bwd0 = 2
    PreAlias = 3
    Final = 4
    All = 5
    N = 6


class PatternsLevel(enum.Enum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


class CollectiveOperator(enum.Enum):
    Add = 0
    Mean = 1
    Mul = 2
    Min = 3
    Max = 4
    LogicalAnd = 5
    LogicalOr = 6
    SquareAdd = 7
    Local = 8
    N = 9


class TensorLocation:
    """Where PopART keeps a class of tensors (upstream `popart.TensorLocation`)."""

    def __init__(self, storage: TensorStorage = TensorStorage.OnChip,
                 replicatedTensorSharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off
                 ) -> None:
        if not isinstance(storage, TensorStorage):
            raise TypeError(f"TensorLocation: storage must be a popart.TensorStorage, got "
                            f"{storage!r}")
        if not isinstance(replicatedTensorSharding, ReplicatedTensorSharding):
            raise TypeError(f"TensorLocation: replicatedTensorSharding must be a "
                            f"popart.ReplicatedTensorSharding, got {replicatedTensorSharding!r}")
        self.storage = storage
        self.replicatedTensorSharding = replicatedTensorSharding

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TensorLocation) and other.storage == self.storage
                and other.replicatedTensorSharding == self.replicatedTensorSharding)

    def __repr__(self) -> str:
        return f"TensorLocation({self.storage}, {self.replicatedTensorSharding})"


class TensorLocationSettings:
    """Location policy for a class of tensors (upstream `popart.TensorLocationSettings`)."""

    def __init__(self, location: TensorLocation | TensorStorage | None = None,
                 minElementsForOffChip: int = 2,
                 minElementsForReplicatedTensorSharding: int = 8192) -> None:
        if isinstance(location, TensorStorage):
            location = TensorLocation(location)
        self.location = TensorLocation() if location is None else location
        self.minElementsForOffChip = minElementsForOffChip
        self.minElementsForReplicatedTensorSharding = minElementsForReplicatedTensorSharding


class AccumulateOuterFragmentSettings:
    """Upstream `popart.AccumulateOuterFragmentSettings`."""

    def __init__(self, schedule: AccumulateOuterFragmentSchedule =
                 AccumulateOuterFragmentSchedule.Serial, excludedVirtualGraphs=()) -> None:
        self.schedule = schedule
        self.excludedVirtualGraphs = list(excludedVirtualGraphs)


def _defaults() -> Dict[str, Any]:
    """Upstream's defaults for the options PopXL programs and popxl itself touch."""
    return {
        # set by popxl.Ir()
        "virtualGraphMode": VirtualGraphMode.Off, "useHostCopyOps": False,
        "aliasZeroCopy": False, "enableExplicitMainLoops": False,
        "explicitRecomputation": False, "enableInplaceAmbiguityChecking": False,
        "enableVariablesCaching": True, "decomposeGradSum": False,
        # replication (popdist.popart.configureSessionOptions)
        "enableReplicatedGraphs": False, "replicatedGraphCount": 1,
        "enableDistributedReplicatedGraphs": False, "globalReplicationFactor": 1,
        "globalReplicaOffset": 0,
        # graph construction and scheduling
        "numIOTiles": 0, "partialsTypeMatMuls": "", "convolutionOptions": {},
        "matmulOptions": {}, "lstmOptions": {}, "engineOptions": {}, "reportOptions": {},
        "gclOptions": {}, "enableOutlining": True, "outlineThreshold": 1.0,
        "enableGradientAccumulation": False, "accumulationFactor": 1,
        "enablePipelining": False, "autoRecomputation": RecomputationType.Undefined,
        "executionPhaseSettings": None,
        "accumulateOuterFragmentSettings": AccumulateOuterFragmentSettings(),
        "accumulationAndReplicationReductionType": ReductionType.Sum,
        "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
        "mergeVarUpdate": MergeVarUpdateType.Off, "mergeVarUpdateMemThreshold": 1000000,
        "enableStochasticRounding": False, "enableFloatingPointChecks": False,
        "enableFullyConnectedPass": True, "enableSerializedMatmuls": True,
        "enableStableNorm": False, "enableEngineCaching": False, "cachePath": "session_cache",
        "syntheticDataMode": SyntheticDataMode.Off, "instrumentWithHardwareCycleCounter": False,
        "hardwareInstrumentations": {Instrumentation.Outer},
        "enablePrefetchDatastreams": True, "defaultPrefetchBufferingDepth": 1,
        "rearrangeAnchorsOnHost": True, "rearrangeStreamsOnHost": False,
        "activationTensorLocationSettings": TensorLocationSettings(),
        "weightTensorLocationSettings": TensorLocationSettings(),
        "optimizerStateTensorLocationSettings": TensorLocationSettings(),
        "accumulatorTensorLocationSettings": TensorLocationSettings(),
        "tensorLocationSettingsOverride": {}, "logDir": "", "dotChecks": set(),
        "opxModulesToLoad": [], "customCodelets": [], "compileEngine": True,
        "constantWeights": True, "batchSerializationSettings": None,
        "automaticLossScalingSettings": None, "developerSettings": None,
        "kahnTieBreaker": "greedy", "swapLimitScheduler": -1, "timeLimitScheduler": 1e9,
        # float8: a log2 scale outside [-32, 32) at run time raises (else undefined upstream)
        "throwIfLog2ScaleTensorNotInRange": True,
    }


class SessionOptions:
    """Upstream `popart.SessionOptions`: the options a PopART session is built with.

    `ir._pb_ir.getSessionOptions()` returns the Ir's instance; `popxl.Ir()` sets the options
    upstream's Ir constructor sets. Setting an option name PopART does not have raises
    `AttributeError`, as upstream's pybind class does.
    """

    __slots__ = tuple(_defaults())

    def __init__(self) -> None:
        for k, v in _defaults().items():
            object.__setattr__(self, k, v)
        # As upstream: POPART_CACHE_DIR / POPXL_CACHE_DIR turn engine caching on (POPXL's wins;
        # the emulator compiles no Poplar engine, so the cache stays unused).
        for var in ("POPART_CACHE_DIR", "POPXL_CACHE_DIR"):
            path = os.environ.get(var)
            if path:
                object.__setattr__(self, "enableEngineCaching", True)
                object.__setattr__(self, "cachePath", path)

    def __repr__(self) -> str:
        settings = (TensorLocationSettings, AccumulateOuterFragmentSettings)
        changed = {k: getattr(self, k) for k, v in _defaults().items()
                   if getattr(self, k) != v and not isinstance(v, settings)}
        return f"SessionOptions({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


class OptimizerValue:
    """A scalar optimiser hyper-parameter: a compile-time constant or a runtime tensor input
    (upstream `popart.OptimizerValue`)."""

    def __init__(self, val: float = 0.0, isConst: bool = True) -> None:
        self._val = float(val)
        self._is_const = bool(isConst)

    def val(self) -> float:
        return self._val

    def isConst(self) -> bool:
        return self._is_const

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OptimizerValue) and other._val == self._val
                and other._is_const == self._is_const)

    def __repr__(self) -> str:
        return f"OptimizerValue({self._val}, isConst={self._is_const})"


class PyWeightsIO:
    """Host buffers by tensor id for `session._pb_session.readWeights/writeWeights`
    (upstream `popart.PyWeightsIO`)."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        for tid, arr in weights.items():
            if not isinstance(tid, str) or not isinstance(arr, np.ndarray):
                raise TypeError(f"PyWeightsIO: expected {{tensor id (str): numpy array}}, got "
                                f"{type(tid).__name__}: {type(arr).__name__}")
        self.weights = dict(weights)

    def contains(self, tensor_id: str) -> bool:
        return tensor_id in self.weights

    def weight(self, tensor_id: str) -> np.ndarray:
        return self.weights[tensor_id]
