"""`Conv2D`."""
from __future__ import annotations

from functools import partial
from typing import Optional, Tuple, Union

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._init import truncnorm

__all__ = ["Conv2D"]


class Conv2D(Module):
    """2-D convolution: `weight` (out, in/groups, kh, kw), `bias` (1, out, 1, 1)."""

    def __init__(self, out_channels: int, kernel_size: Union[int, Tuple[int, int]],
                 strides: Tuple[int, int] = (1, 1),
                 paddings: Union[Tuple[int, int, int, int], str] = (0, 0, 0, 0),
                 dilations: Tuple[int, int] = (1, 1), groups: int = 1, bias: bool = True,
                 available_memory_proportions=None, partials_types=None,
                 enable_conv_dithering=None,
                 replica_grouping: Optional[popxl.ReplicaGrouping] = None):
        super().__init__()
        self.out_channels = out_channels
        self.kernel_size = (kernel_size, kernel_size) if isinstance(kernel_size, int) \
            else tuple(kernel_size)
        self.k_h, self.k_w = self.kernel_size
        self.strides = tuple(strides)
        if isinstance(paddings, str):
            if paddings not in ("same_upper", "same_lower", "valid"):
                raise ValueError(f"Conv2D: paddings must be 4 ints or 'same_upper', "
                                 f"'same_lower', 'valid', got {paddings!r}")
            self.pad_type, self.paddings = paddings, (0, 0, 0, 0)
        else:
            self.pad_type, self.paddings = "not_set", tuple(paddings)
        self.dilations = tuple(dilations)
        self.groups = groups
        self.bias = bias
        self.available_memory_proportions = available_memory_proportions
        self.partial_types = partials_types          # upstream's attribute name
        self.enable_conv_dithering = enable_conv_dithering
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        in_ch = x.shape[1]
        w = self.add_variable_input(
            "weight", partial(truncnorm, (self.out_channels, in_ch // self.groups,
                                          *self.kernel_size)),
            x.dtype, replica_grouping=self.replica_grouping)
        y = ops.conv(x, w, self.strides, self.paddings, self.dilations, self.groups,
                     self.pad_type, self.available_memory_proportions, self.partial_types,
                     self.enable_conv_dithering)
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, (1, self.out_channels, 1, 1)),
                                        x.dtype, replica_grouping=self.replica_grouping)
            y = y + b
        return y

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        """Weights of a `torch.nn.Conv2d` for this layer's variables."""
        npd = dtype.as_numpy()
        weights = {variables.weight: nn_layer.weight.data.numpy().astype(npd)}
        if nn_layer.bias is not None:
            weights[variables.bias] = nn_layer.bias.data.numpy().astype(npd).reshape(1, -1, 1, 1)
        return WeightsDict(weights)
