"""`NamedTensors` (a DotTree of popxl Tensors) and `NamedTensorData` (of host arrays)."""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np

import popxl
from popxl import ops

from .dot_tree import DotTree

__all__ = ["NamedTensors", "NamedTensorData", "print_named_tensors", "TensorMap"]

TensorMap = Mapping[popxl.Tensor, popxl.Tensor]


class NamedTensors(DotTree[popxl.Tensor]):
    """A DotTree of `popxl.Tensor`."""

    @property
    def tensors(self) -> Tuple[popxl.Tensor, ...]:
        """All tensors, sorted by `Tensor.name` (not by key)."""
        return tuple(sorted(self.values_flat(), key=lambda t: t.name))

    @property
    def named_tensors(self) -> Dict[str, popxl.Tensor]:
        """A plain dict {flat key: tensor} in insertion order."""
        return dict(self._flat_items())

    def remap(self, mapping: Mapping[popxl.Tensor, popxl.Tensor]) -> "NamedTensors":
        """A copy with every tensor `t` replaced by `mapping[t]`."""
        return self.map(lambda t: mapping[t])


class NamedTensorData(DotTree[np.ndarray]):
    """A DotTree of host arrays."""


def print_named_tensors(named_tensors: NamedTensors) -> NamedTensors:
    """`ops.print_tensor` every tensor, titled with its key; returns the printed tensors."""
    return NamedTensors.from_dict({k: ops.print_tensor(t, title=k)
                                   for k, t in named_tensors.to_dict().items()})
