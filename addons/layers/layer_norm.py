"""`LayerNorm`."""
from __future__ import annotations

from functools import partial
import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict

__all__ = ["LayerNorm"]


class LayerNorm(Module):
    """Layer norm of a 2-D input over its last dim: `weight` ones(C), `bias` zeros(C)."""

    def build(self, x: popxl.Tensor, eps: float = 1e-5) -> popxl.Tensor:
        if x.rank != 2:
            raise ValueError(f"LayerNorm: the input must be 2-D (reshape first), got '{x.id}' "
                             f"{x.shape}")
        w = self.add_variable_input("weight", partial(np.ones, x.shape[-1]), x.dtype)
        b = self.add_variable_input("bias", partial(np.zeros, x.shape[-1]), x.dtype)
        return ops.layer_norm(x, w, b, eps=eps)

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        npd = dtype.as_numpy()
        return WeightsDict({
            variables.weight: nn_layer.weight.data.numpy().flatten().astype(npd),
            variables.bias: nn_layer.bias.data.numpy().flatten().astype(npd)})
