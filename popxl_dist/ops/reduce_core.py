"""Builder: sum (ReduceSum). The other reductions live in `reductions.py`."""
from __future__ import annotations

from typing import Optional, Sequence, Union

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor, normalize_axes

__all__ = ["sum"]


def reduce_shape(t: Tensor, axes, keepdims: bool):
    return tuple((1 if i in axes else s) for i, s in enumerate(t.shape) if keepdims or i not in axes)


def reduce_op(op_type: str, settings: str, t: Tensor, axis, keepdims: bool, out_dtype=None) -> Tensor:
    check_tensor(t, settings, "t")
    axes = normalize_axes(settings, axis, t.rank)
    shape = reduce_shape(t, axes, keepdims)
    return add_op(op_type, op_type, [t], [Out(f"{settings}_out", shape, out_dtype or t.dtype)],
                  {"axes": axes, "keepdims": bool(keepdims)})[0]


def sum(t: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Sum over `axis` (all axes when None)."""
    return reduce_op("ReduceSum", "sum", t, axis, keepdims)
