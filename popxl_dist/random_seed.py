"""`popxl.create_seeds`: host-side seeds for the random ops."""
from __future__ import annotations

import numpy as np

__all__ = ["create_seeds"]


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
