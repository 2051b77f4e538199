"""`NamedReplicaGrouping` and the popdist instance / IPU-link-domain grouping helpers."""
from __future__ import annotations

import json
import logging
import os
from typing import Iterable, Optional, TypeVar

import popdist
import popxl
from popxl import ReplicaGrouping

from .dot_tree import DotTree

__all__ = ["NamedReplicaGrouping", "fill_none_group", "get_instance_replica_grouping",
           "is_cross_instance", "get_ild_size_from_popdist", "get_ild_replica_grouping",
           "is_cross_ild"]

logger = logging.getLogger(__name__)
CLS = TypeVar("CLS", bound="NamedReplicaGrouping")


class NamedReplicaGrouping(DotTree[ReplicaGrouping]):
    """A DotTree of `popxl.ReplicaGrouping`."""

    @classmethod
    def build_groups(cls, names: Iterable[str], value: ReplicaGrouping) -> "NamedReplicaGrouping":
        """The same grouping under every name."""
        return cls.from_dict({n: value for n in names})


def fill_none_group(rg: Optional[ReplicaGrouping], none_value: ReplicaGrouping
                    ) -> ReplicaGrouping:
    """`rg`, or `none_value` when `rg` is None."""
    return none_value if rg is None else rg


def _or_all(rg: Optional[ReplicaGrouping]) -> ReplicaGrouping:
    """`rg`, or the all-replicas grouping of the current Ir."""
    return fill_none_group(rg, popxl.gcg().ir.replica_grouping())


def _restrict(rg: ReplicaGrouping, block: int, what: str) -> ReplicaGrouping:
    """`rg` cut so that no group leaves a block of `block` consecutive replicas (an instance or
    an IPU-link domain). Constant groupings keep their stride (group size `block // stride`;
    a stride beyond the block is refused, as upstream). Non-constant groupings (upstream
    raises NotImplementedError, having no stride) keep each group's members within a block,
    which needs every block to repeat the first block's pattern."""
    ir = rg._ir
    if rg.is_const:
        if rg.stride > block:
            raise ValueError(f"{what}: the replica grouping's stride {rg.stride} must not "
                             f"exceed the {block} replicas it is restricted to")
        if rg.group_size * rg.stride <= block:
            return rg
        return ir.replica_grouping(stride=rg.stride, group_size=block // rg.stride)
    R = ir.replication_factor
    if block <= 0 or R % block:
        raise ValueError(f"{what}: the block of {block} replicas does not divide the "
                         f"{R} replicas")
    pattern = None
    assignment = []
    for b in range(R // block):
        labels = rg.assignment[b * block:(b + 1) * block]
        first_seen = {g: i for i, g in reversed(list(enumerate(labels)))}
        order = sorted(first_seen, key=first_seen.get)
        local = [order.index(g) for g in labels]
        if pattern is None:
            pattern = local
        elif local != pattern:
            raise ValueError(f"{what}: the grouping {rg!r} does not repeat the same pattern in "
                             f"every block of {block} replicas")
        assignment += [b * (max(pattern) + 1) + g for g in local]
    return ir.replica_grouping_from_assignments(assignment)


def _crosses(rg: ReplicaGrouping, block: int) -> bool:
    if rg.is_const:
        return rg.group_size * rg.stride > block
    return any(len({r // block for r in members}) > 1 for members in rg.groups())


def get_instance_replica_grouping(replica_grouping: Optional[ReplicaGrouping] = None
                                  ) -> ReplicaGrouping:
    """`replica_grouping` (default all replicas) restricted to one popdist instance: groups
    that cross instances are cut at the instance boundaries (`ir.instance_replication_factor`
    consecutive replicas); a constant grouping keeps its stride.

    This is what upstream's docstring describes; upstream's code returns a constant grouping
    unchanged when every instance repeats its pattern and raises otherwise, and raises
    NotImplementedError for a non-constant one."""
    ir = popxl.gcg().ir
    rg = _or_all(replica_grouping)
    return _restrict(rg, ir.instance_replication_factor, "get_instance_replica_grouping")


def is_cross_instance(replica_grouping: Optional[ReplicaGrouping]) -> bool:
    """Whether some group of `replica_grouping` spans several popdist instances."""
    ir = popxl.gcg().ir
    return _crosses(_or_all(replica_grouping), ir.instance_replication_factor)


_warned = False


def get_ild_size_from_popdist() -> int:
    """The IPU-link domain size: `ipuLinkDomainSize` of the JSON env `POPLAR_TARGET_OPTIONS`,
    else min(replication factor, 64) (with a warning, once, under popdist)."""
    global _warned
    opts = os.environ.get("POPLAR_TARGET_OPTIONS")
    if opts:
        try:
            parsed = json.loads(opts)
        except ValueError as e:
            raise ValueError(f"POPLAR_TARGET_OPTIONS is not valid JSON ({e}): {opts!r}") from None
        if isinstance(parsed, dict) and "ipuLinkDomainSize" in parsed:
            size = parsed["ipuLinkDomainSize"]
            if isinstance(size, bool) or not isinstance(size, (int, str)) \
                    or not str(size).isdigit() or int(size) < 1:
                raise ValueError(f"POPLAR_TARGET_OPTIONS: ipuLinkDomainSize must be a positive "
                                 f"int, got {size!r}")
            return int(size)
    rf = popxl.gcg().ir.replication_factor
    if popdist.isPopdistEnvSet() and not _warned:
        _warned = True
        logger.warning("ipuLinkDomainSize not found in POPLAR_TARGET_OPTIONS; assuming %d",
                       min(rf, 64))
    return min(rf, 64)


def get_ild_replica_grouping(replica_grouping: Optional[ReplicaGrouping] = None
                             ) -> ReplicaGrouping:
    """`replica_grouping` (default all replicas) restricted to one IPU-link domain
    (`get_ild_size_from_popdist()` consecutive replicas)."""
    ir = popxl.gcg().ir
    rg = _or_all(replica_grouping)
    size = get_ild_size_from_popdist()
    if rg.is_const:
        return _restrict(rg, size, "get_ild_replica_grouping")
    return _restrict(rg, min(size, ir.replication_factor), "get_ild_replica_grouping")


def is_cross_ild(replica_grouping: Optional[ReplicaGrouping]) -> bool:
    """Whether some group of `replica_grouping` spans several IPU-link domains."""
    rg = _or_all(replica_grouping)
    return _crosses(rg, get_ild_size_from_popdist())
