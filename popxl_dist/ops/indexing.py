"""`Tensor.__getitem__`: basic indexing becomes slice (+ subsample) + squeeze, an integer index
tensor becomes gather, a bool mask becomes where.

Deviation from upstream (documented fix): negative ints follow NumPy, so `x[-1]` is the last
element (upstream turns it into the empty slice `[-1:0]`). Out-of-range ints raise IndexError.
`...` (Ellipsis) is supported; `None` (newaxis) is not.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from ..tensor import Tensor, constant

__all__ = []  # tensor_getitem is reached through Tensor.__getitem__ only


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _bad_key(t: Tensor, key: Any) -> TypeError:
    return TypeError(f"Tensor indexing of '{t.id}': unsupported key {key!r} (type "
                     f"{type(key).__name__}); use ints, slices, '...', a tuple of them, an integer "
                     f"Tensor/array (gather) or a bool Tensor/array (mask)")


def tensor_getitem(t: Tensor, key: Any) -> Tensor:
    """`t[key]` built from ops (see the module docstring)."""
    if isinstance(key, Tensor):
        return _tensor_key(t, key)
    if isinstance(key, list):        # host data, nested lists too (upstream: a constant of it)
        try:
            arr = np.asarray(key)
        except ValueError:           # ragged
            raise _bad_key(t, key) from None
        if arr.size and arr.dtype.kind in "iub":
            key = arr
    if isinstance(key, np.ndarray):
        if key.dtype.kind in "iub":
            return _tensor_key(t, constant(key.astype(np.int32) if key.dtype.kind in "iu"
                                           else key))
        raise _bad_key(t, key)
    if _is_int(key) or isinstance(key, slice) or key is Ellipsis:
        key = (key,)
    if isinstance(key, tuple) and all(_is_int(k) or isinstance(k, slice) or k is Ellipsis
                                      for k in key):
        return _basic(t, key)
    raise _bad_key(t, key)


def _tensor_key(t: Tensor, key: Tensor) -> Tensor:
    from .. import ops

    if key.dtype.is_int:
        return ops.gather(t, key)
    if key.dtype.name == "bool":
        where = getattr(ops, "where", None)
        if where is None:
            raise NotImplementedError("Tensor indexing with a bool mask needs ops.where, which is "
                                      "not available")
        return where(key, t, constant(0, t.dtype))
    raise TypeError(f"Tensor indexing of '{t.id}': an index tensor must be integer (gather) or "
                    f"bool (mask), got '{key.id}' {key.dtype.name}")


def _basic(t: Tensor, key: tuple) -> Tensor:
    from .. import ops

    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError(f"Tensor indexing of '{t.id}': an index can only have a single "
                         f"ellipsis ('...'), got {key!r}")
    n_idx = len(key) - n_ell
    if n_idx > t.rank:
        raise IndexError(f"Tensor indexing of '{t.id}': too many indices for a tensor of shape "
                         f"{t.shape}: {key!r}")
    items: List[Any] = []
    for k in key:
        if k is Ellipsis:
            items.extend([slice(None)] * (t.rank - n_idx))
        else:
            items.append(k)
    starts, stops, steps, axes, int_axes = [], [], [], [], []
    strides = [1] * t.rank
    for ax, k in enumerate(items):
        dim = t.shape[ax]
        if _is_int(k):
            i = int(k) + dim if k < 0 else int(k)
            if not 0 <= i < dim:
                raise IndexError(f"Tensor indexing of '{t.id}': index {int(k)} is out of range "
                                 f"for axis {ax} with size {dim}")
            starts.append(i), stops.append(i + 1), steps.append(1), axes.append(ax)
            int_axes.append(ax)
            continue
        if k.start is None and k.stop is None and k.step in (None, 1):
            continue
        b, e, s = k.indices(dim)
        if len(range(b, e, s)) == 0:
            b, e, s = 0, 0, 1
        # e == -1 with a negative step means "through index 0": ONNX needs a stop below -dim.
        starts.append(b), stops.append(e if e >= 0 else -dim - 1), axes.append(ax)
        steps.append(1 if s > 0 else -1)
        if abs(s) > 1:
            strides[ax] = abs(s)
    out = t
    if axes:
        out = ops.slice(out, starts, stops, steps, axes)
    if any(s > 1 for s in strides):
        out = ops.subsample(out, strides)
    if int_axes:
        out = ops.squeeze(out, int_axes)
    return out
