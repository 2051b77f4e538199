"""Weight initialisers shared by the layers."""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["truncnorm"]


def truncnorm(shape: Tuple[int, ...], a: float = -2.0, b: float = 2.0, loc: float = 0.0,
              scale: float = 0.02) -> np.ndarray:
    """Samples of a normal(loc, scale) truncated to [loc + a*scale, loc + b*scale].

    A NumPy stand-in for upstream's `scipy.stats.truncnorm.rvs(a, b, loc, scale, size=shape)`
    (scipy is not a dependency): rejection sampling from `np.random.standard_normal`, so it
    draws from the global NumPy RNG like scipy does, but not the same numbers.
    """
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.float64)
    filled = 0
    while filled < n:
        z = np.random.standard_normal(max(2 * (n - filled), 16))
        z = z[(z >= a) & (z <= b)][: n - filled]
        out[filled:filled + z.size] = z
        filled += z.size
    return (loc + scale * out).reshape(shape)
