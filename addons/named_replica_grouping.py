"""`NamedReplicaGrouping` and the popdist instance / IPU-link-domain grouping helpers."""
from __future__ import annotations

import json
import logging
import os
from typing import Iterable, Optional, TypeVar

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


def _or_all(replica_grouping: Optional[ReplicaGrouping], ir: popxl.Ir) -> ReplicaGrouping:
    return fill_none_group(replica_grouping, ir.replica_grouping())


def get_instance_replica_grouping(replica_grouping: Optional[ReplicaGrouping] = None
                                  ) -> ReplicaGrouping:
    """Restrict the grouping to one popdist instance (same stride, smaller group if it
    crosses)."""
    ir = popxl.gcg().ir
    rg = _or_all(replica_grouping, ir)
    irf = ir.instance_replication_factor
    if rg.group_size * rg.stride <= irf:
        return rg
    return ir.replica_grouping(stride=rg.stride, group_size=max(irf // rg.stride, 1))


def is_cross_instance(replica_grouping: Optional[ReplicaGrouping]) -> bool:
    ir = popxl.gcg().ir
    rg = _or_all(replica_grouping, ir)
    return rg.group_size * rg.stride > ir.instance_replication_factor


_warned = False


def get_ild_size_from_popdist() -> int:
    """`ipuLinkDomainSize` from the JSON env `POPLAR_TARGET_OPTIONS`, else min(rf, 64)."""
    global _warned
    opts = os.environ.get("POPLAR_TARGET_OPTIONS")
    if opts:
        try:
            return int(json.loads(opts)["ipuLinkDomainSize"])
        except (KeyError, ValueError, TypeError):
            pass
    rf = popxl.gcg().ir.replication_factor
    if os.environ.get("POPDIST_NUM_TOTAL_REPLICAS") and not _warned:
        _warned = True
        logger.warning("ipuLinkDomainSize not found in POPLAR_TARGET_OPTIONS; assuming %d",
                       min(rf, 64))
    return min(rf, 64)


def get_ild_replica_grouping(replica_grouping: Optional[ReplicaGrouping] = None
                             ) -> ReplicaGrouping:
    ir = popxl.gcg().ir
    rg = _or_all(replica_grouping, ir)
    ild = get_ild_size_from_popdist()
    if rg.group_size * rg.stride <= ild:
        return rg
    return ir.replica_grouping(stride=rg.stride, group_size=max(ild // rg.stride, 1))


def is_cross_ild(replica_grouping: Optional[ReplicaGrouping]) -> bool:
    rg = _or_all(replica_grouping, popxl.gcg().ir)
    return rg.group_size * rg.stride > get_ild_size_from_popdist()
