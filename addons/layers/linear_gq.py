"""`LinearGQ`: a dense layer whose weight is stored 4-bit group-quantised."""
from __future__ import annotations

from functools import partial
from typing import Callable, List, Optional, Tuple

import numpy as np

import popxl

from ..module import Module
from ..named_tensors import NamedTensors
from ..ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress,
)
from ..utils import WeightsDict
from ._init import truncnorm

__all__ = ["LinearGQ"]


class _SharedDraws:
    """Three variable factories fed from one random weight per draw: the n-th call of
    component k returns part k of the n-th compressed weight (factories are drawn in step)."""

    def __init__(self, make: Callable[[], Tuple[np.ndarray, ...]]):
        self._make = make
        self._draws: List[Tuple[np.ndarray, ...]] = []
        self._calls = [0, 0, 0]

    def component(self, k: int, dtype: np.dtype) -> Callable[[], np.ndarray]:
        def next_value() -> np.ndarray:
            n = self._calls[k]
            self._calls[k] += 1
            while len(self._draws) <= n:
                self._draws.append(self._make())
            return self._draws[n][k].astype(dtype)
        return next_value


class LinearGQ(Module):
    """y = x @ W + b with W `(in, out)` held as 4-bit codes plus per-group scale and bias
    (`group_quantize_compress_numpy`), decompressed on the device for each call.

    Variables: `weight` (uint16 codes), `weight_scale` and `weight_bias` (x's dtype), and
    `bias` (out,) zeros. The initial W is a truncated normal (std 0.02), quantised.

    Args:
        out_features: output width.
        bias: add a bias.
        replica_grouping: grouping of every variable.
        group_size: values per quantisation group along `dim` (a multiple of 4); 0 puts the whole
            axis in one group.
        dim: the axis of W that is grouped (-1: output features).
    """

    def __init__(self, out_features: int, bias: bool = True,
                 replica_grouping: Optional[popxl.ReplicaGrouping] = None, group_size: int = 0,
                 dim: int = -1):
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping
        self.group_size = group_size
        self.dim = dim

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        shape = (x.shape[-1], self.out_features)
        group = self.group_size or shape[self.dim]

        def draw() -> Tuple[np.ndarray, ...]:
            return group_quantize_compress_numpy(truncnorm(shape), group, self.dim)

        group_quantize_compress_numpy(np.zeros(shape, np.float32), group, self.dim)  # checks
        draws = _SharedDraws(draw)
        rg = self.replica_grouping
        npd = x.dtype.as_numpy()
        w = self.add_variable_input("weight", draws.component(0, np.uint16), popxl.uint16,
                                    replica_grouping=rg)
        scale = self.add_variable_input("weight_scale", draws.component(1, npd), x.dtype,
                                        replica_grouping=rg)
        offset = self.add_variable_input("weight_bias", draws.component(2, npd), x.dtype,
                                         replica_grouping=rg)
        y = x @ group_quantize_decompress(w, scale, offset, self.dim)
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, self.out_features), x.dtype,
                                        replica_grouping=rg)
            y = y + b
        return y

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32,
                      group_size: int = 64, dim: int = -1) -> WeightsDict:
        """{variable: data} from a `torch.nn.Linear`: its weight, transposed to `(in, out)`,
        is group-quantised with `group_size` along `dim`."""
        npd = dtype.as_numpy()
        w = nn_layer.weight.data.T.numpy().astype(np.float32)
        packed, scale, offset = group_quantize_compress_numpy(w, group_size, dim)
        state = WeightsDict({variables.weight: packed,
                             variables.weight_scale: scale.astype(npd),
                             variables.weight_bias: offset.astype(npd)})
        if "bias" in variables:
            state[variables.bias] = nn_layer.bias.data.numpy().astype(npd)
        return state
