"""`layer_norm_distributed`: layer norm whose statistics are all-reduced over a group."""
from __future__ import annotations

from typing import Optional

import popxl
from popxl.ops._tensor_parallel import layer_norm_distributed as _build

__all__ = ["layer_norm_distributed"]


def layer_norm_distributed(t: popxl.Tensor, w: popxl.Tensor, b: popxl.Tensor,
                           epsilon: float = 1e-5,
                           group: Optional[popxl.ReplicaGrouping] = None) -> popxl.Tensor:
    """Layer norm of `t` over its last (hidden) axis, which is sharded over the replicas of
    `group`: replica i holds the hidden units `[i*H, (i+1)*H)`.

    The mean and variance are sums all-reduced over the group (two passes, in float32); `w`
    and `b` are this replica's shards of the scale and bias. The gradient all-reduces the two
    sums the input gradient needs; the `w` and `b` gradients are local to the shard.

    Args:
        t: `(..., H)` float32/float16, this replica's hidden shard of each row.
        w: `(H,)` scale shard. b: `(H,)` bias shard.
        epsilon: added to the variance.
        group: the replicas sharing the hidden axis (default all replicas).

    Returns:
        The normalised shard, shaped like `t`.
    """
    return _build(t, w, b, epsilon, group)
