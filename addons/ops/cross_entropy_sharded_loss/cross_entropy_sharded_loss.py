"""`cross_entropy_sharded_loss`: the loss of a vocabulary-parallel language-model head."""
from __future__ import annotations

from typing import Literal, Optional, Union

import popxl
from popxl.ops._tensor_parallel import cross_entropy_sharded

__all__ = ["cross_entropy_sharded_loss", "REDUCTION_TYPE"]

REDUCTION_TYPE = Literal["mean", "sum", "none"]


def cross_entropy_sharded_loss(logits: popxl.Tensor, indices: popxl.Tensor,
                               ignore_index: Union[None, int, popxl.Tensor] = None,
                               replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                               reduction: REDUCTION_TYPE = "mean",
                               available_memory_proportion: float = 0.4) -> popxl.Tensor:
    """Softmax cross entropy of logits whose classes are sharded over the replicas of a group.

    Replica i of each group holds the classes `[i*C, (i+1)*C)` of the full vocabulary
    (`logits` is its `(N, C)` shard). The max, the sum of exponentials and the logit of each
    row's class are reduced over the group, so every member computes the same loss; the gradient
    with respect to each member's shard is `softmax - onehot` restricted to that shard.

    Args:
        logits: `(N, C)` float32/float16 logits of this replica's class shard.
        indices: `(N,)` integer classes, already offset by this shard's first class (`label -
            i*C`): a row whose index is outside `[0, C)` has its class on another shard.
        ignore_index: rows whose (offset) index equals it get no loss and no gradient; an int or
            an integer scalar Tensor (offset it like `indices`, e.g. per shard through a
            variable with a replica grouping).
        replica_grouping: the shards' grouping (default all replicas); group members ordered
            by replica index hold consecutive class shards.
        reduction: "mean" (over the rows not ignored, at least 1), "sum" or "none" (`(N,)`).
        available_memory_proportion: a tile-memory hint; no numerical effect here.

    Returns:
        The loss, in the logits' dtype (computed in float32), identical on every member.

    Example:
        >>> tp = ir.replica_grouping(group_size=2)
        >>> loss = cross_entropy_sharded_loss(logits_shard, labels - offset, replica_grouping=tp)
    """
    if (not isinstance(available_memory_proportion, (int, float))
            or not 0 < available_memory_proportion <= 1):
        raise ValueError(f"cross_entropy_sharded_loss: available_memory_proportion must be in "
                         f"(0, 1], got {available_memory_proportion!r}")
    return cross_entropy_sharded(logits, indices, ignore_index, replica_grouping, reduction)
