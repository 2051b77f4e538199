"""NumPy helpers to lay out host data for replicas (shard, repeat, tensor-parallel inputs)."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

__all__ = ["shard", "unshard", "unshard_arrays", "repeat", "repeat_axis", "split2D", "shard2D",
           "unshard2D", "repeat_shard", "tensor_parallel_input", "pad_axis", "squeeze_safe",
           "handle_negative_axis"]


def handle_negative_axis(x: np.ndarray, axis: int) -> int:
    """`axis` as a non-negative index into `x.shape`."""
    return axis if axis >= 0 else x.ndim + axis


def shard(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Split `x` into `n` pieces along `axis` and stack them on a new axis 0."""
    return np.ascontiguousarray(np.stack(np.split(x, n, axis=axis)))


def unshard(x: np.ndarray, axis: int) -> np.ndarray:
    """Inverse of `shard`: concatenate the pieces of axis 0 along `axis` (of a piece)."""
    return np.concatenate(list(x), axis=axis)


def unshard_arrays(xs: Sequence[np.ndarray], axis: int) -> np.ndarray:
    return np.concatenate(list(xs), axis=axis)


def repeat(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """Insert a new axis at `axis` and repeat `x` `n` times along it."""
    return np.repeat(np.expand_dims(x, axis), n, axis=axis)


def repeat_axis(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """Tile existing `axis` `n` times."""
    reps = [1] * x.ndim
    reps[axis] = n
    return np.tile(x, reps)


def split2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int, axis_2: int) -> List[np.ndarray]:
    """Split along axis_1 into n_1 pieces, each along axis_2 into n_2: a flat list of
    n_1*n_2."""
    return [p2 for p1 in np.split(x, n_1, axis=axis_1) for p2 in np.split(p1, n_2, axis=axis_2)]


def shard2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int, axis_2: int) -> np.ndarray:
    """`split2D` stacked on a new axis 0 (axis_1 is the outer one)."""
    return np.ascontiguousarray(np.stack(split2D(x, n_1, n_2, axis_1, axis_2)))


def unshard2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int, axis_2: int) -> np.ndarray:
    """Inverse of `shard2D`."""
    rows = [np.concatenate(list(x[i * n_2:(i + 1) * n_2]), axis=axis_2) for i in range(n_1)]
    return np.concatenate(rows, axis=axis_1)


def repeat_shard(x: np.ndarray, n_repeats: int, n_shards: int, shard_axis: int,
                 sharded_tensor: str = "contiguous") -> np.ndarray:
    """Shards of `x` (split along `shard_axis`) repeated: "contiguous" `[s0,s0,s1,s1]` or
    "strided" `[s0,s1,s0,s1]`."""
    shards = shard(x, n_shards, shard_axis)
    if sharded_tensor == "contiguous":
        return np.repeat(shards, n_repeats, axis=0)
    if sharded_tensor == "strided":
        return np.concatenate([shards] * n_repeats, axis=0)
    raise ValueError(f"sharded_tensor must be 'contiguous' or 'strided', got "
                     f"{sharded_tensor!r}")


def squeeze_safe(x: np.ndarray, axis=None) -> np.ndarray:
    """`np.squeeze` of the given axes that have size 1 (others are left alone)."""
    if axis is None:
        return np.squeeze(x)
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = [handle_negative_axis(x, a) for a in axes]
    axes = tuple(a for a in axes if x.shape[a] == 1)
    return np.squeeze(x, axis=axes) if axes else x


def tensor_parallel_input(input_data: np.ndarray, tp: int, rf: int,
                          repeat_fn: Optional[Callable[[np.ndarray, int], np.ndarray]] = None
                          ) -> np.ndarray:
    """Host data `[n, ...]` laid out as `[n_host_transfers, rf, ...]` so that consecutive `tp`
    replicas get the same sample; host-load and replica axes of size 1 are squeezed."""
    dp = rf // tp
    data = np.asarray(input_data)
    n = data.shape[0]
    x = data.reshape(n // dp, dp, *data.shape[1:])
    x = repeat_fn(x, tp) if repeat_fn is not None else np.repeat(x, tp, axis=1)
    return squeeze_safe(x, [0, 1])


def tensor_parallel_output(output_data: np.ndarray, num_host_transfers: int, tp: int, rf: int,
                           data_shape, tp_identical: bool = True,
                           true_num_host_transfers: Optional[int] = None) -> np.ndarray:
    """Inverse of `tensor_parallel_input` for identical tp outputs: one copy per dp replica."""
    out = np.asarray(output_data).reshape(num_host_transfers, rf, *data_shape)
    if tp_identical:
        out = out[:, ::tp]
    if true_num_host_transfers is not None:
        out = out[:true_num_host_transfers]
    return out.reshape(-1, *data_shape)


def pad_axis(x: np.ndarray, n: int, axis: int, value=0) -> np.ndarray:
    """Pad `axis` at the end up to length `n`."""
    axis = handle_negative_axis(x, axis)
    if x.shape[axis] >= n:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return np.pad(x, pad, constant_values=value)
