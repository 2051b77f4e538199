"""Helpers shared by kernel families: IPU-like float16 numerics and scalar coercion."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...dtypes import storage_numpy

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def np_dtype(info) -> np.dtype:
    """The NumPy dtype of a tensor's arrays (uint8 codes for float8)."""
    return storage_numpy(info.dtype)


def via_f32(fn: Callable, out_dtype: np.dtype) -> Callable:
    """Run `fn` in float32 and round once to float16 (the IPU's float16 arithmetic);
    other dtypes run `fn` as it is."""
    if out_dtype != F16:
        return fn

    def wrapped(*arrays):
        res = fn(*[a.astype(F32) if a.dtype == F16 else a for a in arrays])
        return res.astype(F16)

    return wrapped


def scalar(x, dtype=np.float32):
    """A Python number or 0-d/1-element array as a NumPy scalar of `dtype`."""
    return np.asarray(x, dtype=dtype).reshape(())[()]
