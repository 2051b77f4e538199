"""`replicated_all_gather_strided`: gather from every member of a strided group."""
from __future__ import annotations

import popxl
from popxl import ops

from ._checks import check_group, check_tensor

__all__ = ["replicated_all_gather_strided"]


def replicated_all_gather_strided(t: popxl.Tensor,
                                  group: popxl.ReplicaGrouping | None = None) -> popxl.Tensor:
    """Gather `t` from every member of its group, in rank order.

    Args:
        t: the tensor (an RTS shard when it has a `meta_shape`).
        group: constant-stride grouping (None: all replicas).

    Returns:
        A 1-D tensor of `group_size * t.nelms` elements, or, when `t` has a meta_shape, the
        gather truncated to `nelms(meta_shape)` and reshaped to `t.meta_shape`.

    Example:
        >>> full = replicated_all_gather_strided(shard, group=ir.replica_grouping(stride=2))
    """
    opname = "replicated_all_gather_strided"
    check_tensor(t, opname)
    group = check_group(group, opname)
    if t.meta_shape:
        return ops.collectives.replicated_all_gather(t, group=group, output_shape="meta_shape")
    flat = t.reshape((t.nelms,)) if t.rank != 1 else t
    return ops.collectives.replicated_all_gather(flat, axis=0, group=group,
                                                 output_shape="concat")
