"""Partitions of the replicas: which replicas hold the same value (plain data for the
replica-consistency pass, `transforms/replica_consistency.py`, and the run-time check,
`engine/replica_check.py`). A partition is a tuple with one label per replica; replicas with
the same label are in one block, and each label is its block's first replica."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

__all__ = ["Partition", "canonical", "meet", "coarser_or_equal", "variable_partition"]

Partition = Tuple[int, ...]


def canonical(keys: Sequence) -> Partition:
    """The partition whose blocks are the replicas with equal keys (labels: first member)."""
    first: Dict = {}
    return tuple(first.setdefault(k, r) for r, k in enumerate(keys))


def meet(a: Partition, b: Partition) -> Partition:
    """Replicas are together when they are together in both."""
    if a == b:
        return a
    return canonical(list(zip(a, b)))


def coarser_or_equal(value: Partition, required: Partition) -> bool:
    """Whether `value` is the same wherever `required` demands it."""
    seen: Dict[int, int] = {}
    for v, q in zip(value, required):
        if seen.setdefault(q, v) != v:
            return False
    return True


def variable_partition(info, R: int) -> Optional[Partition]:
    """The replicas that must hold the same value of a variable (its replica grouping's
    groups), or None when the variable may differ between replicas by design (sharded, or
    read back per replica)."""
    extra = info.extra or {}
    if extra.get("sharded") or extra.get("retrieval_mode") == "all_replicas":
        return None
    rg = extra.get("replica_grouping")
    if rg is None:
        return (0,) * R
    return canonical([rg.group_of(r) for r in range(R)])
