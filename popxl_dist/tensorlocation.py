"""Tensor locations and placement enums (`popxl.tensorlocation` upstream): tile sets, execution
contexts, on/off-chip storage and replicated tensor sharding."""
from __future__ import annotations

import enum

__all__ = ["ExecutionContext", "TileSet", "TensorStorage", "ReplicatedTensorSharding",
           "TensorLocation"]


class ExecutionContext(enum.Enum):
    Normal = "Normal"
    AccumulateOuterFragment = "AccumulateOuterFragment"
    WeightsFromHostFragment = "WeightsFromHostFragment"
    WeightsToHostFragment = "WeightsToHostFragment"
    OptimizerFromHostFragment = "OptimizerFromHostFragment"
    Subgraph = "Subgraph"


class TileSet(enum.Enum):
    Compute = "compute"
    IO = "io"
    Undefined = "undefined"
    N = "N"


class TensorStorage(enum.Enum):
    OnChip = "OnChip"
    OffChip = "OffChip"


class ReplicatedTensorSharding(enum.Enum):
    Off = "Off"
    On = "On"


class TensorLocation:
    """Where a tensor lives: on or off chip, and whether it is replica-sharded."""

    def __init__(self, storage: TensorStorage = TensorStorage.OnChip,
                 replicated_tensor_sharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off):
        self.storage = storage
        self.replicated_tensor_sharding = replicated_tensor_sharding

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TensorLocation) and other.storage == self.storage
                and other.replicated_tensor_sharding == self.replicated_tensor_sharding)

    def __repr__(self) -> str:
        return f"TensorLocation({self.storage}, {self.replicated_tensor_sharding})"
