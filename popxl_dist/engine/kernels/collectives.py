"""Kernels: collectives across replicas (ReplicatedAllReduce[Inplace], ReplicatedReduceScatter,
ReplicatedAllGather), and AllReduce across the IPUs of one replica.

Collective factories return ``fn(comm, per_replica) -> outputs``: `per_replica[j]` is the input
tuple of the worker's j-th local replica (`comm.replicas[j]`), and `fn` returns one array per
local replica. The Communicator does the reduction (float16 accumulates in float32, members in
ascending replica order), so every backend gives the same bits.

Layouts: a reduce-scatter flattens its input, zero-pads it to k*ceil(n/k) and gives member i
the contiguous chunk i (upstream's CBR order is unobservable with the paired gather). The
gather stacks members in ascending order, then concatenates or rebuilds the meta_shape.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..comm import reduce_values
from .registry import kernel

__all__: list = []   # registrations only

PerReplica = Sequence[tuple[np.ndarray, ...]]


def _group_args(attrs) -> tuple[str, int, int]:
    return attrs.get("op", "local"), int(attrs["stride"]), int(attrs["group_size"])


@kernel("ReplicatedAllReduce", collective=True)
def _all_reduce_kernel(attrs, ins, outs) -> Callable:
    op, stride, size = _group_args(attrs)

    def run(comm, per_replica: PerReplica) -> list[np.ndarray]:
        return list(comm.all_reduce([p[0] for p in per_replica], op, stride, size))
    return run


@kernel("ReplicatedAllReduceInplace", collective=True, modifies=(0,))
def _all_reduce_inplace_kernel(attrs, ins, outs) -> Callable:
    op, stride, size = _group_args(attrs)

    def run(comm, per_replica: PerReplica) -> list[np.ndarray]:
        xs = [p[0] for p in per_replica]
        return list(comm.all_reduce(xs, op, stride, size, out=xs))
    return run


@kernel("AllReduce")
def _all_reduce_ipus_kernel(attrs, ins, outs) -> Callable:
    """Within one replica: every output is the reduction of all inputs (in list order, with the
    communicator's tree), or a copy of its own input for identical inputs."""
    op = attrs["op"]
    if attrs.get("identical_inputs"):
        def identity(*xs: np.ndarray) -> tuple:
            return tuple(x.copy() for x in xs)
        return identity

    def run(*xs: np.ndarray) -> tuple:
        total = reduce_values(xs, op)
        return (total,) + tuple(total.copy() for _ in xs[1:])
    return run


def _padded_flat(x: np.ndarray, total: int) -> np.ndarray:
    """`x` flattened and zero-padded at the end to `total` elements (a fresh array)."""
    flat = x.reshape(-1)
    if flat.size == total:
        return flat.copy()
    out = np.zeros((total,), dtype=x.dtype)
    out[:flat.size] = flat
    return out


@kernel("ReplicatedReduceScatter", collective=True)
def _reduce_scatter_kernel(attrs, ins, outs) -> Callable:
    op, stride, size = _group_args(attrs)
    chunk = outs[0].shape[0]
    total = chunk * size

    if op == "local":
        from ..comm import index_in_group

        def local(comm, per_replica: PerReplica) -> list[np.ndarray]:
            res = []
            for r, p in zip(comm.replicas, per_replica):
                i = index_in_group(r, stride, size)
                flat = p[0].reshape(-1)
                part = flat[i * chunk:(i + 1) * chunk]
                out = np.zeros((chunk,), dtype=flat.dtype)
                out[:part.size] = part
                res.append(out)
            return res
        return local

    def run(comm, per_replica: PerReplica) -> list[np.ndarray]:
        return list(comm.reduce_scatter([_padded_flat(p[0], total) for p in per_replica], op,
                                        stride, size))
    return run


@kernel("ReplicatedAllGather", collective=True)
def _all_gather_kernel(attrs, ins, outs) -> Callable:
    _, stride, size = _group_args(attrs)
    mode, axis = attrs["mode"], int(attrs.get("axis", 0))
    out_shape = tuple(outs[0].shape)
    n_out = int(np.prod(out_shape, dtype=np.int64))

    if mode == "new_axis":
        def finish(stacked: np.ndarray) -> np.ndarray:
            return stacked
    elif mode == "concat":
        def finish(stacked: np.ndarray) -> np.ndarray:
            return np.concatenate(list(stacked), axis=axis) if axis else \
                stacked.reshape(out_shape)
    elif mode == "meta_shape":
        def finish(stacked: np.ndarray) -> np.ndarray:
            flat = stacked.reshape(-1)
            return flat[:n_out].reshape(out_shape).copy() if flat.size != n_out else \
                flat.reshape(out_shape)
    else:
        raise ValueError(f"ReplicatedAllGather: unknown output mode {mode!r}")

    def run(comm, per_replica: PerReplica) -> list[np.ndarray]:
        stacked = comm.all_gather([p[0] for p in per_replica], stride, size)
        return _distinct([finish(s) for s in stacked])
    return run


def _distinct(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Copy results that share a buffer with an earlier one, so that local replicas never alias
    (a communicator may hand the same gathered array to every member on the worker)."""
    seen = set()
    out = []
    for a in arrays:
        base = a if a.base is None else a.base
        if id(base) in seen:
            a = a.copy()
        else:
            seen.add(id(base))
        out.append(a)
    return out
