"""`LayerNormDistributed`: a layer norm whose hidden axis is sharded over a replica group."""
from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

import popxl

from ..module import Module
from ..ops.layer_norm_distributed import layer_norm_distributed

__all__ = ["LayerNormDistributed"]


class LayerNormDistributed(Module):
    """Layer norm over the last axis of an input sharded over `replica_grouping`'s members.

    `weight` (ones) and `bias` (zeros) hold this replica's `(H,)` shard; their variables use
    `replica_grouping.transpose()`, so members of a group hold different shards while replicas
    at the same position in different groups (data-parallel copies) share a value.

    Args:
        replica_grouping: the tensor-parallel grouping (default all replicas).
    """

    def __init__(self, replica_grouping: Optional[popxl.ReplicaGrouping] = None):
        super().__init__()
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor, eps: float = 1e-5) -> popxl.Tensor:
        rg = self.replica_grouping or popxl.gcg().ir.replica_grouping()
        h = x.shape[-1]
        w = self.add_variable_input("weight", partial(np.ones, h), x.dtype,
                                    replica_grouping=rg.transpose())
        b = self.add_variable_input("bias", partial(np.zeros, h), x.dtype,
                                    replica_grouping=rg.transpose())
        return layer_norm_distributed(x, w, b, epsilon=eps, group=rg)
