"""`cross_entropy_sharded_wr_loss`: sharded cross entropy within one replica ("wr")."""
from __future__ import annotations

from typing import List, Optional, Sequence

import popxl
from popxl.ops._tensor_parallel import cross_entropy_sharded_wr

__all__ = ["cross_entropy_sharded_wr_loss", "handle_ipus"]


def handle_ipus(ts: Sequence[popxl.Tensor], ipus: Optional[Sequence[int]]) -> List[int]:
    """The IPU of each tensor: `ipus` checked against `ts`, or inferred from the tensors."""
    if ipus is None:
        return [t.ipu for t in ts]
    ipus = list(ipus)
    if len(ipus) != len(ts):
        raise ValueError(f"cross_entropy_sharded_wr_loss: {len(ts)} tensors but {len(ipus)} "
                         f"ipus {ipus}")
    return ipus


def cross_entropy_sharded_wr_loss(logits: Sequence[popxl.Tensor],
                                  indices: Sequence[popxl.Tensor],
                                  ipus: Optional[Sequence[int]] = None) -> List[popxl.Tensor]:
    """Mean softmax cross entropy of logits whose classes are sharded over IPUs of one replica.

    Shard i (on IPU `ipus[i]`) holds the classes `[i*C, (i+1)*C)`; `indices[i]` are the labels
    offset by `i*C` (see `cross_entropy_sharded_loss`). The statistics are reduced over the
    shards with the same tree as the replicated version, so both give the same bits.

    Args:
        logits: one `(N, C)` float32/float16 tensor per IPU.
        indices: one `(N,)` integer tensor per IPU.
        ipus: the IPU of each shard (default: where each logits tensor was produced).

    Returns:
        One scalar mean loss per IPU (identical values). The gradient of each reaches its own
        IPU's shard, as each replica back-propagates its own copy of the replicated loss.
    """
    if ipus is not None and isinstance(logits, (list, tuple)):
        ipus = handle_ipus(logits, ipus)
    return cross_entropy_sharded_wr(logits, indices, ipus)
