"""`grad_op`: the builder of the dedicated grad op types (GeluGrad, SliceGrad, ...) that grad rules
emit; upstream has them but popxl exposes no builder. (`expand` is in `shape.py`.)"""
from __future__ import annotations

from ..tensor import Tensor
from ._builder import Out, add_op

__all__ = ["grad_op"]


def grad_op(op_type: str, inputs, like: Tensor, attrs=None, name: str = None) -> Tensor:
    """A single-output grad op (e.g. GeluGrad) whose output has `like`'s shape and dtype."""
    settings = name or op_type[0].lower() + op_type[1:]
    return add_op(op_type, settings, list(inputs),
                  [Out(f"{settings}_out", like.shape, like.dtype, like.meta_shape)], attrs)[0]
