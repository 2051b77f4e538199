"""`popdist.popart.configureSessionOptions`: fills a session-options object with the instance's
replica placement, as upstream does for `popart.SessionOptions`."""
from __future__ import annotations

import popdist

__all__ = ["configureSessionOptions"]


def configureSessionOptions(opts) -> None:
    """Set `enableDistributedReplicatedGraphs`, `globalReplicationFactor`, `globalReplicaOffset`,
    `replicatedGraphCount` and `enableReplicatedGraphs` on `opts`."""
    local = popdist.getNumLocalReplicas()
    opts.enableDistributedReplicatedGraphs = popdist.isPopdistEnvSet()
    opts.globalReplicationFactor = popdist.getNumTotalReplicas()
    opts.globalReplicaOffset = popdist.getReplicaIndexOffset()
    opts.replicatedGraphCount = local
    opts.enableReplicatedGraphs = local > 1
