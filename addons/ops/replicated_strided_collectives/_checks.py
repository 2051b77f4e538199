"""Argument checks shared by the strided collectives."""
from __future__ import annotations

import popxl

__all__ = ["check_tensor", "check_group", "check_reduce_op"]

_STRIDED_REDUCE_OPS = ("add", "mean")


def check_tensor(t: object, opname: str) -> popxl.Tensor:
    if not isinstance(t, popxl.Tensor):
        raise TypeError(f"{opname}: 't' must be a popxl.Tensor, got {type(t).__name__}")
    return t


def check_group(group: popxl.ReplicaGrouping | None, opname: str
                ) -> popxl.ReplicaGrouping | None:
    if group is None:
        return None
    if not isinstance(group, popxl.ReplicaGrouping):
        raise TypeError(f"{opname}: 'group' must be a popxl.ReplicaGrouping or None, got "
                        f"{type(group).__name__}")
    if not group.is_const:
        raise NotImplementedError(f"{opname}: {group!r} does not have a constant stride, so it "
                                  f"has no stride and group size for a strided collective")
    return group


def check_reduce_op(op: object, opname: str) -> str:
    if not isinstance(op, str) or op.lower() not in _STRIDED_REDUCE_OPS:
        raise ValueError(f"{opname}: op must be one of {_STRIDED_REDUCE_OPS}, got {op!r}")
    return op.lower()
