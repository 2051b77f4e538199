"""`ReplicaGrouping`: how replicas are split into groups (for variables and collectives)."""
from __future__ import annotations

import math
from functools import reduce
from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:
    from .ir import Ir

__all__ = ["ReplicaGrouping"]


class ReplicaGrouping:
    """Groups of replicas. Constant-stride groupings have `stride` and `group_size`:
    replica r is in group `r % stride + stride * (r // (stride * group_size))`.
    """

    def __init__(self, *a, **k):
        raise RuntimeError("ReplicaGrouping is created with ir.replica_grouping(...) or "
                           "ir.replica_grouping_from_assignments(...)")

    @classmethod
    def _from_params(cls, ir: "Ir", stride: int = 1, group_size: Optional[int] = None):
        r = ir.replication_factor
        if group_size is None:
            if not isinstance(stride, int) or stride <= 0 or r % stride:
                raise ValueError(f"replica_grouping: stride must divide the replication factor "
                                 f"{r}, got stride={stride}")
            group_size = r // stride
        if not (isinstance(stride, int) and 0 < stride <= r and r % stride == 0):
            raise ValueError(f"replica_grouping: stride must satisfy 0 < stride <= {r} and divide "
                             f"{r}, got stride={stride}")
        if not (isinstance(group_size, int) and 0 < group_size <= r):
            raise ValueError(f"replica_grouping: group_size must satisfy 0 < group_size <= {r}, "
                             f"got group_size={group_size}")
        if group_size == 1:
            stride = 1
        if stride == 1 and r % group_size:
            raise ValueError(f"replica_grouping: group_size {group_size} must divide the "
                             f"replication factor {r}")
        if stride > 1 and (r % (stride * group_size)):
            raise ValueError(f"replica_grouping: stride*group_size ({stride}*{group_size}) must "
                             f"divide the replication factor {r}")
        g = object.__new__(cls)
        g._ir = ir
        g._stride = stride
        g._group_size = group_size
        g._assignment = None
        return g

    @classmethod
    def _from_assignment(cls, ir: "Ir", assignment: List[int]):
        r = ir.replication_factor
        assignment = [int(a) for a in assignment]
        if len(assignment) != r:
            raise ValueError(f"replica_grouping_from_assignments: need {r} entries (one per "
                             f"replica), got {len(assignment)}")
        groups = sorted(set(assignment))
        if groups != list(range(len(groups))):
            raise ValueError("replica_grouping_from_assignments: groups must be numbered 0..G-1, "
                             f"got {assignment}")
        first_seen = list(dict.fromkeys(assignment))
        if first_seen != groups:
            raise ValueError("replica_grouping_from_assignments: groups must be numbered in the "
                             f"order their first replica appears, got {assignment} (groups in "
                             f"order of appearance: {first_seen})")
        sizes = {g: assignment.count(g) for g in groups}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"replica_grouping_from_assignments: all groups must have the same "
                             f"size, got {sizes}")
        gs = sizes[0]
        for stride in range(1, r + 1):
            try:
                cand = cls._from_params(ir, stride, gs)
            except ValueError:
                continue
            if cand.assignment == assignment:
                return cand
        g = object.__new__(cls)
        g._ir = ir
        g._stride = None
        g._group_size = gs
        g._assignment = assignment
        return g

    # --- properties --------------------------------------------------------------------
    @property
    def num_replicas(self) -> int:
        return self._ir.replication_factor

    @property
    def is_const(self) -> bool:
        return self._assignment is None

    @property
    def stride(self) -> int:
        if self._stride is None:
            raise NotImplementedError("stride is undefined for a non-constant replica grouping")
        return self._stride

    @property
    def group_size(self) -> int:
        return self._group_size

    @property
    def num_groups(self) -> int:
        return self.num_replicas // self._group_size

    @property
    def assignment(self) -> List[int]:
        if self._assignment is not None:
            return list(self._assignment)
        return [self.group_of(r) for r in range(self.num_replicas)]

    def group_of(self, r: int) -> int:
        if self._assignment is not None:
            return self._assignment[r]
        s, k = self._stride, self._group_size
        return r % s + s * (r // (s * k))

    def members(self, group: int) -> List[int]:
        """Replicas of `group` in ascending order (the order collectives reduce in)."""
        if self._assignment is not None:
            return [r for r, g in enumerate(self._assignment) if g == group]
        s, k = self._stride, self._group_size
        base = (group // s) * s * k + group % s
        return [base + i * s for i in range(k)]

    def index_in_group(self, r: int) -> int:
        return self.members(self.group_of(r)).index(r)

    def groups(self) -> List[List[int]]:
        return [self.members(g) for g in range(self.num_groups)]

    def transpose(self) -> "ReplicaGrouping":
        """Swap the roles of members and groups."""
        assignment = [0] * self.num_replicas
        for g, members in enumerate(self.groups()):
            for i, r in enumerate(members):
                assignment[r] = i
        return ReplicaGrouping._from_assignment(self._ir, assignment)

    @property
    def const_rg(self) -> "ReplicaGrouping":
        """The constant-stride grouping the device stores a variable of this grouping by: the
        grouping itself when it is constant-stride; otherwise, as upstream, the stride is the
        smallest distance d between consecutive members of a group, every group is cut into
        runs of members d apart, and the group size is the greatest common divisor of the run
        lengths (each of its groups lies inside one group here). E.g. `[0, 0, 1, 1, 0, 0, 1, 1]`
        gives `[0, 0, 1, 1, 2, 2, 3, 3]`."""
        if self.is_const:
            return self
        const = getattr(self, "_const_cache", None)
        if const is None:
            const = self._refine_to_const()
            self._const_cache = const
        return const

    def _refine_to_const(self) -> "ReplicaGrouping":
        groups = self.groups()
        gaps = [b - a for m in groups for a, b in zip(m, m[1:])]
        step = min(gaps)
        runs: List[int] = []
        for m in groups:
            length = 1
            for a, b in zip(m, m[1:]):
                if b - a == step:
                    length += 1
                else:
                    runs.append(length)
                    length = 1
            runs.append(length)
        size = reduce(math.gcd, runs)
        return ReplicaGrouping._from_params(self._ir, step if size > 1 else 1, size)

    @property
    def to_device_map(self) -> Optional[List[int]]:
        """For a non-constant grouping, this grouping's group of each group of `const_rg` (so
        `data[to_device_map]` is per-group host data laid out for `const_rg`); None for a
        constant-stride grouping."""
        if self.is_const:
            return None
        const = self.const_rg
        return [self.group_of(const.members(c)[0]) for c in range(const.num_groups)]

    @property
    def to_host_map(self) -> Optional[List[int]]:
        """For a non-constant grouping, the first `const_rg` group (in replica order) of each of
        this grouping's groups (so `device_data[to_host_map]` is one value per group here);
        None for a constant-stride grouping."""
        if self.is_const:
            return None
        const = self.const_rg
        return [const.group_of(self.members(g)[0]) for g in range(self.num_groups)]

    @property
    def _pb_replica_grouping(self):
        """The grouping as upstream's `_ir.ReplicaGrouping` (constant-stride groupings only)."""
        from ._pb_shim import PbReplicaGrouping

        if not self.is_const:
            raise NotImplementedError(
                f"{self!r} does not have a constant stride, so it has no PopART "
                f"ReplicaGrouping; collectives (GCL ops) cannot use it (use its const_rg or "
                f"transpose)")
        return PbReplicaGrouping(self.num_replicas, self._stride, self._group_size)

    def _to_variable_settings(self, retrieval_mode: Optional[str] = None):
        """`popart.VariableSettings` of a variable with this (constant-stride) grouping."""
        import popart

        if not self.is_const:
            raise NotImplementedError(
                f"{self!r} does not have a constant stride, so it has no PopART "
                f"VariableSettings (variables store it as its const_rg)")
        if retrieval_mode is None or retrieval_mode == "one_per_group":
            mode = popart.VariableRetrievalMode.OnePerGroup
        elif retrieval_mode == "all_replicas":
            mode = popart.VariableRetrievalMode.AllReplicas
        else:
            raise ValueError(f"Invalid retrieval_mode: {retrieval_mode!r} (expected "
                             f"'one_per_group' or 'all_replicas')")
        return popart.VariableSettings(self._stride, self._group_size, mode)

    def _key(self) -> Tuple:
        return (self.num_replicas, tuple(self.assignment))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReplicaGrouping):
            raise TypeError(f"Cannot compare a ReplicaGrouping with {type(other).__name__}")
        return other._ir is self._ir and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        if self.is_const:
            return (f"ReplicaGrouping(num_replicas={self.num_replicas}, stride={self._stride}, "
                    f"group_size={self._group_size}, num_groups={self.num_groups})")
        return f"ReplicaGrouping(assignment={self._assignment})"

    def __getstate__(self):
        return {"num_replicas": self.num_replicas, "assignment": self.assignment,
                "stride": self._stride, "group_size": self._group_size}

    def __setstate__(self, state):
        # Unpickled groupings (on workers) carry their numbers; the Ir stays behind.
        self._ir = _DetachedIr(state["num_replicas"])
        self._stride = state["stride"]
        self._group_size = state["group_size"]
        self._assignment = None if state["stride"] is not None else state["assignment"]


class _DetachedIr:
    def __init__(self, r: int):
        self.replication_factor = r
