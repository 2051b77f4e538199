"""NumPy helpers to lay out host data for replicas (shard, repeat, tensor-parallel inputs).

Shards are stacked on a new leading axis in replica-group order: `shard(x, n, axis)[i]` is piece
i of `x` along `axis`; `shard2D` orders its n_1 * n_2 pieces with axis_1 outermost.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["shard", "unshard_arrays", "unshard", "repeat", "repeat_axis", "split2D", "shard2D",
           "unshard2D", "repeat_shard", "tensor_parallel_input", "pad_axis", "squeeze_safe",
           "handle_negative_axis"]


def handle_negative_axis(x: np.ndarray, axis: int) -> int:
    """`axis` of `x` as a non-negative index.

    Raises:
        IndexError: `x` is 0-dimensional or `axis` is outside `[-x.ndim, x.ndim)`.
    """
    if x.ndim == 0:
        raise IndexError("Array is 0-dimensional")
    if not -x.ndim <= axis < x.ndim:
        raise IndexError(f"Axis is out of range. Axis: {axis}. Array Rank: {x.ndim}")
    return axis + x.ndim if axis < 0 else axis


def shard(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Split `x` into `n` equal pieces along `axis`, stacked on a new axis 0.

    Example: `shard(np.arange(8).reshape(4, 2), 2, 1)` has shape (2, 4, 1): the even column,
    then the odd one.
    """
    axis = handle_negative_axis(x, axis)
    return np.stack(np.split(x, n, axis=axis))


def unshard_arrays(xs: List[np.ndarray], axis: int) -> np.ndarray:
    """Concatenate pieces that each carry a leading axis of size 1 (as `np.split` of a
    `shard` result gives them) along `axis` of a piece without that axis, and drop it."""
    xs = [np.asarray(x) for x in xs]
    if len({x.ndim for x in xs}) > 1:
        raise ValueError("All arrays must be of the same rank. Ranks: "
                         + ",".join(str(x.ndim) for x in xs))
    if any(x.ndim == 0 or x.shape[0] != 1 for x in xs):
        raise ValueError(f"unshard_arrays: every array needs a leading axis of size 1, got "
                         f"shapes {[x.shape for x in xs]}")
    axis = axis + 1 if axis >= 0 else handle_negative_axis(xs[0], axis)
    return np.concatenate(xs, axis=axis).squeeze(0)


def unshard(x: np.ndarray, axis: int) -> np.ndarray:
    """Inverse of `shard`: the pieces along axis 0 concatenated along `axis` of a piece."""
    return unshard_arrays(np.split(x, x.shape[0], axis=0), axis)


def repeat(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """`x` repeated `n` times along a new axis inserted at `axis`."""
    return np.repeat(np.expand_dims(x, axis), n, axis=axis)


def repeat_axis(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """`x` tiled `n` times along its existing `axis` (`[a, b]` -> `[a, b, a, b]`)."""
    reps = [1] * x.ndim
    reps[axis] = n
    return np.tile(x, reps)


def split2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int,
            axis_2: int) -> List[List[np.ndarray]]:
    """`x` split into `n_1` pieces along `axis_1`, each split into `n_2` along `axis_2`:
    `split2D(...)[i][j]` is piece (i, j)."""
    return [np.split(a, n_2, axis=axis_2) for a in np.split(x, n_1, axis=axis_1)]


def shard2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int, axis_2: int) -> np.ndarray:
    """The `n_1 * n_2` pieces of `split2D` stacked on a new axis 0, axis_1 outermost (piece
    (i, j) at `i * n_2 + j`)."""
    return np.stack([p for row in split2D(x, n_1, n_2, axis_1, axis_2) for p in row])


def unshard2D(x: np.ndarray, n_1: int, n_2: int, axis_1: int, axis_2: int) -> np.ndarray:
    """Inverse of `shard2D` (`axis_1`, `axis_2` are axes of a piece)."""
    if x.shape[0] != n_1 * n_2:
        raise ValueError(f"unshard2D: axis 0 must hold n_1 * n_2 = {n_1 * n_2} pieces, got "
                         f"{x.shape[0]}")
    pieces = np.split(x, x.shape[0], axis=0)
    rows = [unshard_arrays(pieces[i * n_2:(i + 1) * n_2], axis_2) for i in range(n_1)]
    return np.concatenate(rows, axis=axis_1)


def repeat_shard(x: np.ndarray, n_repeats: int, n_shards: int, shard_axis: int,
                 sharded_tensor: str = "contiguous") -> np.ndarray:
    """The `n_shards` shards of `x` (along `shard_axis`) for `n_repeats * n_shards` replicas.

    "contiguous": the shards run over consecutive replicas and the run repeats,
    `[s0, s1, s0, s1]`; "strided": each shard covers `n_repeats` consecutive replicas,
    `[s0, s0, s1, s1]`. (For n_repeats != n_shards upstream's "strided" interleaves the shards
    in another order, which no replica grouping gives; here it is the documented layout.)
    """
    shards = shard(x, n_shards, shard_axis)
    if sharded_tensor == "contiguous":
        return repeat_axis(shards, n_repeats, 0)
    if sharded_tensor == "strided":
        return np.repeat(shards, n_repeats, axis=0)
    raise ValueError(f"sharded_tensor should be either 'contiguous' or 'strided'. Not: "
                     f"{sharded_tensor}")


def _check_tp(tp: int, rf: int) -> None:
    if tp > rf:
        raise ValueError("tensor parallel factor `tp` is not less than replication factor "
                         f"`rf`: {tp} > {rf}")
    if rf % tp:
        raise ValueError("tensor parallel factor `tp` does not equally divide replication "
                         f"factor `rf`: rf/tp={rf / tp}")


def tensor_parallel_input(input_data: np.ndarray, tp: int, rf: int,
                          repeat_fn: Optional[Callable[[np.ndarray, int], np.ndarray]] = None
                          ) -> np.ndarray:
    """Host data `[n, *data_shape]` laid out as `[n_host_transfers, rf, *data_shape]` so that
    each group of `tp` consecutive replicas gets the same sample; tensor-parallel replica i
    gets `repeat_fn(a copy of the samples with an axis 1 of size 1, i)` when given. Host-load
    and replica axes of size 1 are squeezed.
    """
    _check_tp(tp, rf)
    data = np.expand_dims(np.asarray(input_data), axis=1)
    copies = [repeat_fn(data.copy(), i) if repeat_fn is not None else data for i in range(tp)]
    out = np.concatenate(copies, axis=1).reshape(-1, rf, *data.shape[2:])
    return squeeze_safe(out, [0, 1])


def tensor_parallel_output(output_data: np.ndarray, num_host_transfers: int, tp: int, rf: int,
                           data_shape: Tuple[int, ...], tp_identical: bool = True,
                           true_num_host_transfers: Optional[int] = None) -> np.ndarray:
    """Session output `[num_host_transfers, rf, *data_shape]` as `[samples, *data_shape]` (the
    first tensor-parallel replica's when they are identical) or `[samples, tp, *data_shape]`;
    `true_num_host_transfers` drops the transfers after it."""
    _check_tp(tp, rf)
    out = np.asarray(output_data).reshape(num_host_transfers, rf // tp, tp, *data_shape)
    if true_num_host_transfers is not None:
        out = out[:true_num_host_transfers]
    out = out.reshape(-1, tp, *data_shape)
    return out[:, 0] if tp_identical else out


def pad_axis(x: np.ndarray, n: int, axis: int, value: Union[int, float] = 0) -> np.ndarray:
    """`x` padded with `value` at the end of `axis` to length `n`."""
    axis = handle_negative_axis(x, axis)
    if x.shape[axis] > n:
        raise ValueError(f"pad_axis: axis {axis} already has length {x.shape[axis]} > {n}")
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return np.pad(x, pad, constant_values=value)


def squeeze_safe(x: np.ndarray, axis: Optional[Union[int, Sequence[int]]] = None) -> np.ndarray:
    """`np.squeeze` of those of the given axes that have size 1 (the others are kept)."""
    if axis is None:
        return np.squeeze(x)
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = sorted({handle_negative_axis(x, a) for a in axes})
    keep = tuple(a for a in axes if x.shape[a] == 1)
    return np.squeeze(x, axis=keep) if keep else x
