"""Kernels: the tensor-parallel ops (upstream: popxl.addons C++ custom ops).

ReplicatedAllReduceTP / ReplicatedAllReduceStrided: a replicated all-reduce (its `identical_*`
flags only matter to autodiff; an op still flagged `identical_inputs` must have been replaced by
the OpToIdentity pattern). CrossEntropySharded(WR) and LayerNormDistributed reduce their
statistics over the class / hidden shards: across the replicas of a group through the
communicator, or across the IPUs of one replica in memory with the same reduction tree, so both
give the same bits. float16 inputs compute in float32 and round once.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...transforms.patterns import OP_TO_IDENTITY_MESSAGE
from ..comm import reduce_values
from ._util import F32, np_dtype
from .registry import kernel

__all__: list = []   # registrations only

# allreduce(values, op) -> one reduced array per value: values are the shards of one reduction
# (per local replica, or per IPU), reduced across their groups.
AllReduce = Callable[[Sequence[np.ndarray], str], Sequence[np.ndarray]]


def _comm_all_reduce(comm, attrs) -> AllReduce:
    stride, size = int(attrs["stride"]), int(attrs["group_size"])
    return lambda values, op: comm.all_reduce(values, op, stride, size)


def _in_memory_all_reduce(values: Sequence[np.ndarray], op: str) -> list[np.ndarray]:
    total = reduce_values(values, op)
    return [total] * len(values)


@kernel("ReplicatedAllReduceStrided", collective=True)
@kernel("ReplicatedAllReduceTP", collective=True)
def _all_reduce_tp_kernel(attrs, ins, outs) -> Callable:
    if attrs.get("identical_inputs"):
        raise ValueError(OP_TO_IDENTITY_MESSAGE)
    op, stride, size = attrs["op"], int(attrs["stride"]), int(attrs["group_size"])

    def run(comm, per_replica) -> list[np.ndarray]:
        return list(comm.all_reduce([p[0] for p in per_replica], op, stride, size))
    return run


# --- sharded cross entropy ---------------------------------------------------------------------
def _picked(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of rows whose class is in this shard, the logit of that class or 0)."""
    local = (idx >= 0) & (idx < x.shape[1])
    rows = np.arange(x.shape[0])
    return local, np.where(local, x[rows, np.where(local, idx, 0)], np.float32(0))


def _valid(idx: np.ndarray, ignore: np.ndarray | None) -> np.ndarray | None:
    return None if ignore is None else idx != ignore.reshape(())


def _reduce_loss(rows: np.ndarray, valid: np.ndarray | None, reduction: str) -> np.ndarray:
    if valid is not None:
        rows = np.where(valid, rows, np.float32(0))
    if reduction == "none":
        return rows
    total = np.sum(rows, dtype=F32)
    if reduction == "sum":
        return total
    count = rows.shape[0] if valid is None else max(int(np.count_nonzero(valid)), 1)
    return total / np.float32(count)


def ce_forward(xs: Sequence[np.ndarray], idxs: Sequence[np.ndarray],
               ignores: Sequence[np.ndarray | None], reduction: str, dtype: np.dtype,
               all_reduce: AllReduce) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per shard (loss, logsumexp) of the cross entropy over the classes of all shards."""
    x32 = [x.astype(F32, copy=False) for x in xs]
    gmax = all_reduce([x.max(axis=1) for x in x32], "max")
    n = xs[0].shape[0]
    packed = []
    for x, m, idx in zip(x32, gmax, idxs):
        _, picked = _picked(x, idx)
        packed.append(np.concatenate([np.exp(x - m[:, None]).sum(axis=1), picked]))
    sums = all_reduce(packed, "add")
    out = []
    for s, m, idx, ign in zip(sums, gmax, idxs, ignores):
        lse = (np.log(s[:n]) + m).astype(F32)
        loss = _reduce_loss(lse - s[n:], _valid(idx, ign), reduction)
        out.append((np.asarray(loss).astype(dtype), lse))
    return out


def ce_backward(dloss: np.ndarray, x: np.ndarray, idx: np.ndarray, lse: np.ndarray,
                ignore: np.ndarray | None, reduction: str) -> np.ndarray:
    """d loss / d logits of one shard: (softmax - onehot) scaled by the loss gradient."""
    p = np.exp(x.astype(F32) - lse[:, None])
    local, _ = _picked(x, idx)
    rows = np.nonzero(local)[0]
    p[rows, idx[rows]] -= 1
    valid = _valid(idx, ignore)
    d = dloss.astype(F32)
    if reduction == "none":
        scale = d
    elif reduction == "sum":
        scale = np.full(x.shape[0], d, F32)
    else:
        count = x.shape[0] if valid is None else max(int(np.count_nonzero(valid)), 1)
        scale = np.full(x.shape[0], d / np.float32(count), F32)
    if valid is not None:
        scale = np.where(valid, scale, np.float32(0))
    p *= scale[:, None]
    return p.astype(x.dtype, copy=False)


@kernel("CrossEntropySharded", collective=True)
def _ce_sharded_kernel(attrs, ins, outs) -> Callable:
    reduction, dtype = attrs["reduction"], np_dtype(outs[0])
    has_ignore = len(ins) == 3

    def run(comm, per_replica):
        igns = [p[2] for p in per_replica] if has_ignore else [None] * len(per_replica)
        return ce_forward([p[0] for p in per_replica], [p[1] for p in per_replica], igns,
                          reduction, dtype, _comm_all_reduce(comm, attrs))
    return run


@kernel("CrossEntropyShardedGrad")
def _ce_sharded_grad_kernel(attrs, ins, outs) -> Callable:
    """ins (dloss, logits, indices, logsumexp[, ignore_index]) -> dlogits."""
    reduction = attrs["reduction"]

    def run(dloss, x, idx, lse, ignore=None):
        return ce_backward(dloss, x, idx, lse, ignore, reduction)
    return run


@kernel("CrossEntropyShardedWR")
def _ce_sharded_wr_kernel(attrs, ins, outs) -> Callable:
    """ins (logits_0..k-1, indices_0..k-1) -> (loss_0..k-1, logsumexp_0..k-1), mean losses."""
    k = len(ins) // 2
    dtype = np_dtype(outs[0])

    def run(*arrays):
        res = ce_forward(arrays[:k], arrays[k:], [None] * k, "mean", dtype,
                         _in_memory_all_reduce)
        return tuple(loss for loss, _ in res) + tuple(lse for _, lse in res)
    return run


@kernel("CrossEntropyShardedWRGrad")
def _ce_sharded_wr_grad_kernel(attrs, ins, outs) -> Callable:
    """ins (dloss_i, logits_i, indices_i, logsumexp_i for each shard i) -> dlogits_i."""
    k = len(ins) // 4

    def run(*a):
        return tuple(ce_backward(a[i], a[k + i], a[2 * k + i], a[3 * k + i], None, "mean")
                     for i in range(k))
    return run


# --- distributed layer norm --------------------------------------------------------------------
@kernel("LayerNormDistributed", collective=True)
def _ln_distributed_kernel(attrs, ins, outs) -> Callable:
    shape = tuple(ins[0].shape)
    h = shape[-1] if shape else 1
    total = np.float32(h * int(attrs["group_size"]))
    eps = np.float32(attrs["epsilon"])
    dtype = np_dtype(outs[0])

    def run(comm, per_replica):
        all_reduce = _comm_all_reduce(comm, attrs)
        xs = [p[0].astype(F32).reshape(-1, h) for p in per_replica]
        means = [s / total for s in all_reduce([x.sum(axis=1) for x in xs], "add")]
        centred = [x - m[:, None] for x, m in zip(xs, means)]
        var = all_reduce([np.sum(c * c, axis=1) for c in centred], "add")
        res = []
        for c, m, v, p in zip(centred, means, var, per_replica):
            inv = (1 / np.sqrt(v / total + eps)).astype(F32)
            y = c * inv[:, None]
            y *= p[1].astype(F32)
            y += p[2].astype(F32)
            res.append((y.reshape(shape).astype(dtype, copy=False), m.astype(F32),
                        inv))
        return res
    return run


@kernel("LayerNormDistributedGrad", collective=True)
def _ln_distributed_grad_kernel(attrs, ins, outs) -> Callable:
    """ins (dy, x, w, mean, inv_std) -> (dx, dw, db); dx needs the sums of dy*w and
    dy*w*xhat over the whole hidden axis (one all-reduce)."""
    shape = tuple(ins[1].shape)
    h = shape[-1] if shape else 1
    total = np.float32(h * int(attrs["group_size"]))
    dts = [np_dtype(o) for o in outs]

    def run(comm, per_replica):
        parts, packed = [], []
        for dy, x, w, mean, inv in per_replica:
            dy32 = dy.astype(F32).reshape(-1, h)
            xhat = (x.astype(F32).reshape(-1, h) - mean[:, None]) * inv[:, None]
            g = dy32 * w.astype(F32)
            parts.append((dy32, xhat, g, inv))
            packed.append(np.concatenate([g.sum(axis=1), (g * xhat).sum(axis=1)]))
        sums = _comm_all_reduce(comm, attrs)(packed, "add")
        res = []
        for (dy32, xhat, g, inv), s in zip(parts, sums):
            n = xhat.shape[0]
            dx = inv[:, None] * (g - s[:n, None] / total - xhat * (s[n:, None] / total))
            res.append((dx.reshape(shape).astype(dts[0], copy=False),
                        np.sum(dy32 * xhat, axis=0).astype(dts[1]),
                        np.sum(dy32, axis=0).astype(dts[2])))
        return res
    return run


# --- gradient norms ----------------------------------------------------------------------------
@kernel("GradReduceSquareAdd")
def _grad_reduce_square_add_kernel(attrs, ins, outs) -> Callable:
    def run(t, loss_scaling):
        x = t.astype(F32).reshape(-1) / loss_scaling.astype(F32).reshape(())
        return np.asarray(np.sum(x * x, dtype=F32), F32)
    return run
