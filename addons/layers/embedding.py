"""`Embedding`: a (possibly vocabulary-sharded) lookup table."""
from __future__ import annotations

import math
from functools import partial
from typing import Optional

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._init import truncnorm

__all__ = ["Embedding", "MULTISLICE_MAGIC_NUMBER"]

# Upstream's multi-slice planning granularity (a tile-layout constant; no numerical effect).
MULTISLICE_MAGIC_NUMBER = 16


class Embedding(Module):
    """`weight` (vocab_shard_size, hidden); lookup `gather(weight, indices, axis)`.

    With a `replica_grouping` of n groups the vocabulary is sharded over the groups (each group
    its own draw) and out-of-range indices give zeros; indices must be pre-offset (see
    `get_offsets`).
    """

    def __init__(self, dtype: popxl.dtype, vocab_size: int, hidden_size: int, axis: int = 0,
                 replica_grouping: Optional[popxl.ReplicaGrouping] = None):
        super().__init__()
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.axis = axis
        self.replica_grouping = replica_grouping
        self.n_shards = replica_grouping.num_groups if replica_grouping is not None else 1
        self.vocab_shard_size = self.get_vocab_shard_size(vocab_size, self.n_shards)
        self.offsets = self.get_offsets(vocab_size, self.n_shards)

    @staticmethod
    def get_vocab_shard_size(vocab_size: int, n_shards: int) -> int:
        """Per-shard vocabulary, rounded up to a multiple of 16."""
        return 16 * math.ceil(math.ceil(vocab_size / n_shards) / 16)

    @staticmethod
    def get_offsets(vocab_size: int, n_shards: int) -> np.ndarray:
        shard = Embedding.get_vocab_shard_size(vocab_size, n_shards)
        return np.arange(n_shards * shard, step=shard)

    def build(self, indices: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight", partial(truncnorm, (self.vocab_shard_size, self.hidden_size)), self.dtype,
            replica_grouping=self.replica_grouping)
        return ops.gather(w, indices, axis=self.axis, zero_OOR=self.n_shards > 1)

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        npd = dtype.as_numpy()
        w = nn_layer.weight.data.numpy().astype(npd)
        want = variables.weight.shape_on_host if hasattr(variables.weight, "shape_on_host") \
            else variables.weight.shape
        if w.shape != tuple(want):
            pad = np.zeros(want, npd)
            pad[: w.shape[0]] = w
            w = pad
        return WeightsDict({variables.weight: w})
