"""`Linear`: y = x @ W + b."""
from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

import popxl

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._init import truncnorm

__all__ = ["Linear"]


class Linear(Module):
    """A dense layer: `weight` (in, out) (truncated normal, std 0.02), `bias` (out,) zeros."""

    def __init__(self, out_features: int, bias: bool = True,
                 replica_grouping: Optional[popxl.ReplicaGrouping] = None):
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("weight", partial(truncnorm, (x.shape[-1], self.out_features)),
                                    x.dtype, replica_grouping=self.replica_grouping)
        y = x @ w
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype,
                                        replica_grouping=self.replica_grouping)
            y = y + b
        return y

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        """{variable: data} from a `torch.nn.Linear` (its weight is transposed)."""
        npd = dtype.as_numpy()
        state = WeightsDict({variables.weight: nn_layer.weight.data.T.numpy().astype(npd)})
        if "bias" in variables:
            state[variables.bias] = nn_layer.bias.data.numpy().astype(npd)
        return state
