"""Builders: reshape, flatten, transpose (and their in-place view variants)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["reshape", "reshape_", "flatten", "flatten_", "transpose", "transpose_"]


def _shape_entry(s) -> bool:
    return isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_))


def _reshape_shape(t: Tensor, shape: Sequence[int], opname: str) -> Tuple[int, ...]:
    """The new shape of `t`, checked as upstream: a tuple or list of ints, each > 0 or -1, at
    most one -1, keeping the element count."""
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{opname}: shape must be a tuple or list of ints, got "
                        f"{type(shape).__name__} {shape!r}"
                        + (" (use tuple(shape))" if isinstance(shape, np.ndarray) else ""))
    if not all(_shape_entry(s) for s in shape) or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"Invalid shape value in reshape. Must be '>0' or '-1'. Provided "
                         f"{tuple(shape)}. ({opname} of '{t.id}' {t.shape})")
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"Reshape shape can contain at most one '-1' value. Provided {shape}. "
                         f"({opname} of '{t.id}' {t.shape})")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if -1 in shape:
        if t.nelms % known:
            raise ValueError(f"{opname}: cannot reshape '{t.id}' {t.shape} ({t.nelms} elements) "
                             f"to {shape}")
        shape = tuple(t.nelms // known if s == -1 else s for s in shape)
    elif known != t.nelms:
        raise ValueError(f"{opname}: cannot reshape '{t.id}' {t.shape} ({t.nelms} elements) to "
                         f"{shape} ({known} elements)")
    return shape


def reshape_handle_negative_axis(t: Tensor, shape: Sequence[int]) -> Tuple[int, ...]:
    """`shape` with its -1 entry (if any) replaced by the size that keeps `t`'s element count."""
    return _reshape_shape(t, shape, "reshape")


def reshape(t: Tensor, shape: Sequence[int]) -> Tensor:
    """`t` with a new shape (one entry may be -1)."""
    check_tensor(t, "reshape", "t")
    s = _reshape_shape(t, shape, "reshape")
    return add_op("Reshape", "reshape", [t], [Out(f"{t.name}_reshaped", s, t.dtype)])[0]


def reshape_(t: Tensor, shape: Sequence[int]) -> Tensor:
    """A reshaped view of `t`: in-place writes to it reach `t`."""
    check_tensor(t, "reshape_", "t")
    s = _reshape_shape(t, shape, "reshape_")
    return add_op("ReshapeInplace", "reshape_inplace", [t],
                  [Out(f"{t.name}_reshaped", s, t.dtype)])[0]


def flatten(t: Tensor) -> Tensor:
    """`t` as a 1-D tensor."""
    return reshape(t, (-1,)) if t.shape else reshape(t, (1,))


def flatten_(t: Tensor) -> Tensor:
    """A 1-D view of `t`."""
    return reshape_(t, (-1,)) if t.shape else reshape_(t, (1,))


def _perm(t: Tensor, permutation: Optional[Sequence[int]], opname: str) -> Tuple[int, ...]:
    if permutation is None:
        return tuple(reversed(range(t.rank)))
    too_big = tuple(p for p in permutation if isinstance(p, (int, np.integer)) and p >= t.rank)
    if too_big:
        raise ValueError(f"Values in permutation must be less than the tensor's rank {t.rank}. "
                         f"Found {too_big} ({opname} of '{t.id}' {t.shape})")
    perm = tuple(int(p) % max(t.rank, 1) if int(p) < 0 else int(p) for p in permutation)
    if sorted(perm) != list(range(t.rank)):
        raise ValueError(f"{opname}: permutation {tuple(permutation)} is not a permutation of "
                         f"the {t.rank} axes of '{t.id}' {t.shape}")
    return perm


def transpose(t: Tensor, permutation: Optional[Sequence[int]] = None) -> Tensor:
    """Permute the axes of `t` (default: reverse them)."""
    check_tensor(t, "transpose", "t")
    perm = _perm(t, permutation, "transpose")
    shape = tuple(t.shape[p] for p in perm)
    return add_op("Transpose", "transpose", [t], [Out(f"{t.name}_T", shape, t.dtype)],
                  {"perm": perm})[0]


def transpose_(t: Tensor, permutation: Optional[Sequence[int]] = None) -> Tensor:
    """A transposed view of `t`."""
    check_tensor(t, "transpose_", "t")
    perm = _perm(t, permutation, "transpose_")
    shape = tuple(t.shape[p] for p in perm)
    return add_op("TransposeInplace", "transpose_inplace", [t],
                  [Out(f"{t.name}_T", shape, t.dtype)], {"perm": perm})[0]
