"""`GroupNorm`."""
from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict

__all__ = ["GroupNorm"]


class GroupNorm(Module):
    """Group norm of an `(N, C, *spatial)` input with per-channel `weight` / `bias`."""

    def __init__(self, num_groups: int, replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                 eps: float = 1e-5, cache: bool = False):
        super().__init__(cache=cache)
        self.num_groups = num_groups
        self.replica_grouping = replica_grouping
        self.eps = eps

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        c = x.shape[1]
        w = self.add_variable_input("weight", partial(np.ones, c), x.dtype,
                                    replica_grouping=self.replica_grouping)
        b = self.add_variable_input("bias", partial(np.zeros, c), x.dtype,
                                    replica_grouping=self.replica_grouping)
        return ops.group_norm(x, w, b, self.num_groups, self.eps)

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        npd = dtype.as_numpy()
        return WeightsDict({variables.weight: nn_layer.weight.data.numpy().astype(npd),
                            variables.bias: nn_layer.bias.data.numpy().astype(npd)})
