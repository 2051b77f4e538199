"""Builders: random_uniform, random_normal, split_random_seed, dropout and shaped_dropout.

Random numbers are a deterministic function of the uint32 (2,) seed tensor (NumPy Philox in the
kernels); they do not match the IPU's hardware streams.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from .. import dtypes
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor
from .random_seed import create_random_seed

__all__ = ["random_uniform", "random_normal", "split_random_seed", "dropout", "shaped_dropout"]


def _check(opname: str, seed: Tensor, shape: Sequence[int],
           dtype) -> Tuple[Tuple[int, ...], dtypes.dtype]:
    check_tensor(seed, opname, "seed_tensor")
    if seed.dtype != dtypes.uint32 or seed.shape != (2,):
        raise ValueError(f"{opname}: 'seed_tensor' '{seed.id}' must be uint32 of shape (2,), got "
                         f"{seed.dtype.name} {seed.shape}")
    d = dtypes.dtype.as_dtype(dtype)
    if d not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{opname}: dtype must be float16 or float32, got {d.name}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"{opname}: shape {shape} has a negative dimension")
    return shape, d


def random_uniform(seed_tensor: Tensor, shape: Sequence[int], low: float = 0.0,
                   high: float = 1.0, dtype: dtypes.dtype = dtypes.float32) -> Tensor:
    """Samples of U[low, high) of `shape` drawn from `seed_tensor` (no gradient)."""
    shape, d = _check("random_uniform", seed_tensor, shape, dtype)
    return add_op("RandomUniform", "random_uniform", [seed_tensor],
                  [Out("random_uniform_out", shape, d)],
                  {"low": float(low), "high": float(high)})[0]


def random_normal(seed_tensor: Tensor, shape: Sequence[int], mean: float = 0.0, std: float = 1.0,
                  dtype: dtypes.dtype = dtypes.float32) -> Tensor:
    """Samples of N(mean, std^2) of `shape` drawn from `seed_tensor` (no gradient)."""
    shape, d = _check("random_normal", seed_tensor, shape, dtype)
    return add_op("RandomNormal", "random_normal", [seed_tensor],
                  [Out("random_normal_out", shape, d)], {"mean": float(mean), "std": float(std)})[0]


def split_random_seed(seed: Tensor, n: int = 2) -> Tuple[Tensor, ...]:
    """`n` new seeds from `seed`: one ModifyRandomSeed op per uint32 modifier 0..n-1."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"split_random_seed: n must be a positive int, got {n!r}")
    return tuple(create_random_seed(seed, i) for i in range(n))


def _check_seed(opname: str, seed: Tensor) -> None:
    check_tensor(seed, opname, "seed_tensor")
    if seed.dtype != dtypes.uint32 or seed.shape != (2,):
        raise ValueError(f"{opname}: 'seed_tensor' '{seed.id}' must be uint32 of shape (2,), got "
                         f"{seed.dtype.name} {seed.shape}")


def _check_ratio(opname: str, p: float) -> float:
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise TypeError(f"{opname}: the ratio must be a float, got {p!r}") from None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{opname}: the ratio must be in [0, 1), got {p}")
    return p


def dropout(t: Tensor, seed_tensor: Tensor, p: float) -> Tensor:
    """Zero each element with probability `p` and scale the survivors by 1/(1-p), always.

    The mask is a deterministic function of the uint32 (2,) `seed_tensor` (NumPy Philox; it does
    not match the IPU's random stream). The gradient applies the same mask.
    """
    check_tensor(t, "dropout", "t")
    _check_seed("dropout", seed_tensor)
    p = _check_ratio("dropout", p)
    return add_op("Dropout", "dropout", [t, seed_tensor],
                  [Out("dropout_out", t.shape, t.dtype, t.meta_shape)], {"ratio": p})[0]


def shaped_dropout(t: Tensor, seed_tensor: Tensor, shape: Sequence[int], ratio: float) -> Tensor:
    """Dropout whose mask has shape `shape`, broadcast onto `t` (e.g. drop whole rows)."""
    check_tensor(t, "shaped_dropout", "t")
    _check_seed("shaped_dropout", seed_tensor)
    ratio = _check_ratio("shaped_dropout", ratio)
    shape = tuple(int(s) for s in shape)
    ok = len(shape) <= t.rank and all(
        s in (1, d) for s, d in zip(reversed(shape), reversed(t.shape)))
    if not ok:
        raise ValueError(f"shaped_dropout: mask shape {shape} cannot be broadcast onto 't' "
                         f"'{t.id}' {t.shape}")
    return add_op("ShapedDropout", "shaped_dropout", [t, seed_tensor],
                  [Out("shaped_dropout_out", t.shape, t.dtype, t.meta_shape)],
                  {"ratio": ratio, "shape": shape})[0]
