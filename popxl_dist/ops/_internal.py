"""Builders for op types upstream has but popxl does not expose (used by grad rules)."""
from __future__ import annotations

from typing import Tuple

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["expand", "grad_op"]


def expand(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """Broadcast `t` to `shape` (a real copy)."""
    check_tensor(t, "expand", "t")
    return add_op("Expand", "expand", [t], [Out("expand_out", tuple(shape), t.dtype)])[0]


def grad_op(op_type: str, inputs, like: Tensor, attrs=None, name: str = None) -> Tensor:
    """A single-output grad op (e.g. GeluGrad) whose output has `like`'s shape and dtype."""
    settings = name or op_type[0].lower() + op_type[1:]
    return add_op(op_type, settings, list(inputs),
                  [Out(f"{settings}_out", like.shape, like.dtype, like.meta_shape)], attrs)[0]
