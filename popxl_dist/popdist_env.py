"""Replica placement of `Ir(replication="popdist")`: which block of the global replicas this
process (a popdist instance) holds.

Upstream's `Ir("popdist")` calls `popdist.popart.configureSessionOptions(opts)`, which fills in the
global replication factor, the global replica offset and the local replica count; this module does
the same on the Ir's session-options shim and checks the result. With more than one instance
(poprun, `mpirun -n N`, `popxl-run --instances N`) every instance runs the whole script and holds
the contiguous block `[offset, offset + local)` of the global replicas (see
`runtime/instances/runtime.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InstancePlacement", "placement_from_popdist"]


@dataclass(frozen=True)
class InstancePlacement:
    """This instance's place in a popdist launch.

    Args:
        num_instances: processes that each run the whole script.
        index: this instance, in [0, num_instances).
        offset: global index of this instance's first replica.
        local: replicas this instance holds (its `instance_replication_factor`).
        total: the global replication factor.
    """

    num_instances: int
    index: int
    offset: int
    local: int
    total: int

    @property
    def multi(self) -> bool:
        """Whether other instances share the replicas (collectives cross processes)."""
        return self.num_instances > 1

    def describe(self) -> str:
        return (f"instance {self.index} of {self.num_instances}: replicas "
                f"[{self.offset}, {self.offset + self.local}) of {self.total}")


def placement_from_popdist(opts) -> InstancePlacement:
    """Fill `opts` (an Ir's session options) through `popdist.popart.configureSessionOptions`
    and return the placement it describes.

    Raises:
        ValueError: the popdist environment is inconsistent (names the variables).
    """
    import popdist
    import popdist.popart

    popdist.popart.configureSessionOptions(opts)
    p = InstancePlacement(num_instances=popdist.getNumInstances(),
                          index=popdist.getInstanceIndex(),
                          offset=opts.globalReplicaOffset,
                          local=opts.replicatedGraphCount,
                          total=opts.globalReplicationFactor)
    where = (f"Ir(replication='popdist'): POPDIST_NUM_TOTAL_REPLICAS={p.total}, "
             f"POPDIST_NUM_LOCAL_REPLICAS={p.local}, POPDIST_REPLICA_INDEX_OFFSET={p.offset}, "
             f"instance {p.index} of {p.num_instances}")
    if p.total < 1 or p.local < 1:
        raise ValueError(f"{where}: replica counts must be positive")
    if not 0 <= p.index < p.num_instances:
        raise ValueError(f"{where}: the instance index is out of range")
    if p.offset < 0 or p.offset + p.local > p.total:
        raise ValueError(f"{where}: this instance's replicas [{p.offset}, "
                         f"{p.offset + p.local}) do not fit in the {p.total} global replicas")
    if p.num_instances == 1 and p.local != p.total:
        raise ValueError(f"{where}: a single instance must hold every replica")
    return p
