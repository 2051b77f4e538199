"""`popxl.create_seeds`: host-side seeds for the random ops."""
from __future__ import annotations

import numpy as np

__all__ = ["create_seeds", "uint64_to_two_uint32", "two_uint32_to_uint64", "MAX_UINT64"]

MAX_UINT64 = 2 ** 64 - 1


def uint64_to_two_uint32(num: int) -> np.ndarray:
    """A uint64 seed as the uint32 pair (high word, low word) that seed tensors hold."""
    if not isinstance(num, (int, np.integer)) or not 0 <= int(num) <= MAX_UINT64:
        raise ValueError(f"uint64_to_two_uint32: {num!r} is not an integer in [0, 2**64 - 1]")
    num = int(num)
    return np.array([num >> 32, num & 0xFFFFFFFF], dtype=np.uint32)


def two_uint32_to_uint64(a: int, b: int) -> int:
    """The uint64 whose high word is `a` and low word is `b`."""
    for v in (a, b):
        if not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2 ** 32:
            raise ValueError(f"two_uint32_to_uint64: {v!r} is not an integer in [0, 2**32 - 1]")
    return (int(a) << 32) | int(b)


def create_seeds(seed: int, offset: int = 0, batches_per_step: int = 1,
                 gradient_accumulation_factor: int = 1, replicas: int = 1) -> np.ndarray:
    """uint32 seeds of shape squeeze((bps, gaf, replicas, 2)); each row is a uint64 split into
    (high, low) words, drawn with `np.random.default_rng(seed + offset)`."""
    rng = np.random.default_rng(seed + offset)
    n = batches_per_step * gradient_accumulation_factor * replicas
    words = rng.integers(0, 2 ** 64, size=n, dtype=np.uint64)
    out = np.stack([(words >> np.uint64(32)).astype(np.uint32),
                    (words & np.uint64(0xFFFFFFFF)).astype(np.uint32)], axis=-1)
    shape = tuple(d for d in (batches_per_step, gradient_accumulation_factor, replicas) if d > 1)
    return out.reshape(shape + (2,))
