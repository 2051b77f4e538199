"""Kernels: Dropout, ShapedDropout, DropoutGrad, RandomUniform, RandomNormal, ModifyRandomSeed.

Every random stream is a deterministic function of the uint32 (2,) seed tensor: NumPy's Philox
keyed by the 64-bit value (seed[0] << 32) | seed[1]. Same seed, same numbers, on every backend.
The IPU's hardware streams cannot be matched bit for bit (and are not tried).
"""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, np_dtype
from .registry import kernel

__all__ = ["generator", "dropout_mask"]


def generator(seed: np.ndarray) -> np.random.Generator:
    """The random generator of a uint32 (2,) seed tensor value."""
    s = np.asarray(seed, dtype=np.uint32).reshape(-1)
    return np.random.Generator(np.random.Philox(key=(int(s[0]) << 32) | int(s[1])))


def dropout_mask(seed: np.ndarray, shape, ratio: float) -> np.ndarray:
    """float32 mask of `shape`: 1/(1-ratio) where kept, 0 where dropped."""
    keep = generator(seed).random(shape, dtype=np.float32) >= np.float32(ratio)
    return keep.astype(np.float32) * np.float32(1.0 / (1.0 - ratio))


def _dropout_factory(attrs, ins, outs):
    ratio = float(attrs["ratio"])
    dt = np_dtype(outs[0])
    shape = tuple(attrs.get("shape") or outs[0].shape)
    calc = F32 if dt in (F16, F32) else dt

    if ratio == 0.0:
        return lambda x, seed: x.copy()

    def run(x, seed):
        y = x.astype(calc) * dropout_mask(seed, shape, ratio)
        return y.astype(dt, copy=False)
    return run


# DropoutGrad (dy, seed) applies the forward op's mask (the same seed) to dy.
kernel("Dropout")(_dropout_factory)
kernel("ShapedDropout")(_dropout_factory)
kernel("DropoutGrad")(_dropout_factory)


@kernel("RandomUniform")
def _random_uniform(attrs, ins, outs):
    lo, hi = float(attrs["low"]), float(attrs["high"])
    shape, dt = outs[0].shape, np_dtype(outs[0])
    return lambda seed: generator(seed).uniform(lo, hi, shape).astype(dt)


@kernel("RandomNormal")
def _random_normal(attrs, ins, outs):
    mean, std = float(attrs["mean"]), float(attrs["std"])
    shape, dt = outs[0].shape, np_dtype(outs[0])
    return lambda seed: generator(seed).normal(mean, std, shape).astype(dt)


@kernel("ModifyRandomSeed")
def _modify_random_seed(attrs, ins, outs):
    def run(seed, modifier):
        s = np.asarray(seed, dtype=np.uint32).reshape(-1)
        m = int(np.asarray(modifier).reshape(()))
        return np.random.SeedSequence([int(s[0]), int(s[1]), m]).generate_state(2, np.uint32)
    return run
