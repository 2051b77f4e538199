"""`popart.VariableSettings` and `popart.VariableRetrievalMode`: how a variable is shared by the
replicas and read back, as PopART describes it (what `ReplicaGrouping._to_variable_settings`
returns).

A settings object is built either from a stride and group size (what popxl uses) or from a legacy
`CommGroup` (All / Consecutive / Orthogonal / Ungrouped with a group size). Its methods answer
for a given replica count: the groups, their count, size and stride, the replica representing
each group, the host and replica shapes, and how many replicas a read returns.
"""
from __future__ import annotations

import enum
from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["VariableRetrievalMode", "VariableSettings"]


class VariableRetrievalMode(enum.Enum):
    """Which replicas' values a read of a grouped variable returns."""

    OnePerGroup = 0
    AllReduceReplicas = 1
    AllReplicas = 2


def _comm_group_types():
    from popxl.ops.collectives import CommGroup, CommGroupType

    return CommGroup, CommGroupType


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"VariableSettings: {what} must be a positive int, got {value!r}")
    return value


class VariableSettings:
    """How a variable is shared across replicas and retrieved.

    `VariableSettings()`, `VariableSettings(sharedVariableDomain_)`,
    `VariableSettings(retrievalMode_)`, `VariableSettings(sharedVariableDomain_,
    retrievalMode_)` (a `CommGroup` domain) or `VariableSettings(stride, groupSize, mode)`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        CommGroup, CommGroupType = _comm_group_types()
        self._use_comm_group = True
        self._comm_type = CommGroupType.All
        self._stride = 0
        self._group_size = 0
        self._mode = VariableRetrievalMode.OnePerGroup
        names = ("stride", "groupSize", "mode") if len(args) + len(kwargs) == 3 else (
            "sharedVariableDomain_", "retrievalMode_")
        unknown = set(kwargs) - set(names)
        if unknown or len(args) + len(kwargs) > len(names):
            raise TypeError(f"VariableSettings: unexpected arguments {args!r} {kwargs!r}; "
                            f"pass a CommGroup and/or a VariableRetrievalMode, or stride, "
                            f"groupSize and mode")
        values = dict(zip(names, args), **kwargs)
        if names[0] == "stride":
            self._use_comm_group = False
            self._comm_type = None
            self._stride = _positive(values["stride"], "stride")
            self._group_size = _positive(values["groupSize"], "groupSize")
            self._mode = self._check_mode(values["mode"])
            if self._group_size == 1:
                self._stride = 1
            return
        domain = values.get("sharedVariableDomain_")
        mode = values.get("retrievalMode_")
        if isinstance(domain, VariableRetrievalMode) and mode is None:
            domain, mode = None, domain
        if domain is not None:
            if not isinstance(domain, CommGroup):
                raise TypeError(f"VariableSettings: sharedVariableDomain_ must be a CommGroup, "
                                f"got {type(domain).__name__}")
            if domain.type not in (CommGroupType.All, CommGroupType.Ungrouped) \
                    and domain.replicaGroupSize < 1:
                raise ValueError(f"VariableSettings: a {domain.type.name} CommGroup needs a "
                                 f"replicaGroupSize >= 1, got {domain.replicaGroupSize}")
            self._comm_type = domain.type
            self._group_size = domain.replicaGroupSize
        if mode is not None:
            self._mode = self._check_mode(mode)

    @staticmethod
    def _check_mode(mode: Any) -> VariableRetrievalMode:
        if not isinstance(mode, VariableRetrievalMode):
            raise TypeError(f"VariableSettings: the retrieval mode must be a "
                            f"popart.VariableRetrievalMode, got {mode!r}")
        return mode

    # --- what it was built from -------------------------------------------------------------
    def isUsingCommGroup(self) -> bool:
        return self._use_comm_group

    def getCommGroupType(self):
        return self._comm_type

    def getSharedVariableDomain(self):
        CommGroup, _ = _comm_group_types()
        if not self._use_comm_group:
            raise RuntimeError("VariableSettings: these settings were made from a stride and a "
                               "group size, not a CommGroup")
        return CommGroup(self._comm_type, self._group_size)

    def getStride(self) -> int:
        return self._stride

    def getGroupSize(self) -> int:
        return self._group_size

    def getRetrievalMode(self) -> VariableRetrievalMode:
        return self._mode

    # --- for a replica count ------------------------------------------------------------
    def _stride_size(self, replicaCount: int) -> Tuple[int, int]:
        """(stride, group size) of the groups over `replicaCount` replicas."""
        if not self._use_comm_group:
            return self._stride, self._group_size
        _, T = _comm_group_types()
        if self._comm_type == T.All:
            return 1, replicaCount
        if self._comm_type == T.Ungrouped or self._group_size == 1:
            return 1, 1
        if self._comm_type == T.Consecutive:
            return 1, self._group_size
        return replicaCount // self._group_size, self._group_size      # Orthogonal

    def getReplicaGrouping(self, numReplicas: int):
        """The groups over `numReplicas` replicas as a `popart._internal.ir` grouping."""
        from popxl._pb_shim import PbReplicaGrouping

        stride, size = self._stride_size(numReplicas)
        return PbReplicaGrouping(numReplicas, stride, size)

    def getGroupCount(self, replicaCount: int) -> int:
        return replicaCount // self._stride_size(replicaCount)[1]

    def getRealGroupSize(self, replicaCount: int) -> int:
        return self._stride_size(replicaCount)[1]

    def numReplicasReturningVariable(self, replicaCount: int) -> int:
        """How many values a read returns: every replica's, or one per group."""
        if self._mode == VariableRetrievalMode.AllReplicas:
            return replicaCount
        return self.getGroupCount(replicaCount)

    def groups(self, replicaCount: int) -> List[List[int]]:
        """The replicas of each group, groups in order, members ascending."""
        stride, size = self._stride_size(replicaCount)
        out = []
        for g in range(replicaCount // size):
            base = (g // stride) * stride * size + g % stride
            out.append([base + i * stride for i in range(size)])
        return out

    def getGroupRepresentative(self, group: int) -> int:
        """The first replica of `group`."""
        if not self._use_comm_group:
            stride, size = self._stride, self._group_size
            return (group // stride) * stride * size + group % stride
        _, T = _comm_group_types()
        if self._comm_type == T.All:
            return 0
        if self._comm_type == T.Consecutive:
            return self._group_size * group
        return group

    def shapeOnReplica(self, full_shape: Sequence[int], replicaCount: int,
                       name: Optional[str] = "") -> List[int]:
        """`full_shape` (host layout) without its group axis."""
        groups = self.getGroupCount(replicaCount)
        full_shape = list(full_shape)
        if groups == 1:
            return full_shape
        if not full_shape or full_shape[0] != groups:
            raise ValueError(f"VariableSettings: the outer dimension of tensor '{name}' "
                             f"({full_shape[0] if full_shape else 'none'}) must be the number "
                             f"of groups, {groups}")
        return full_shape[1:]

    def shapeOnHost(self, replica_shape: Sequence[int], replicaCount: int) -> List[int]:
        """`replica_shape` with the group axis in front (when there are several groups)."""
        groups = self.getGroupCount(replicaCount)
        return list(replica_shape) if groups == 1 else [groups, *replica_shape]

    def verify(self) -> None:
        """Settings are checked when built; nothing is left to check."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VariableSettings):
            return NotImplemented
        return ((self._use_comm_group, self._comm_type, self._stride, self._group_size,
                 self._mode) == (other._use_comm_group, other._comm_type, other._stride,
                                 other._group_size, other._mode))

    def __hash__(self) -> int:
        return hash((self._use_comm_group, self._stride, self._group_size, self._mode))

    def __repr__(self) -> str:
        kind = (f"commGroupType={self._comm_type.name}" if self._use_comm_group
                else f"stride={self._stride}")
        return (f"VariableSettings({kind}, groupSize={self._group_size}, "
                f"retrievalMode={self._mode.name})")
