"""Kernels: reductions (ReduceSum/Mean/Max/Min/Prod/Median/SumSquare/L1/L2/LogSum/LogSumExp),
ArgMax, ArgMin, TopK, CumSum, Histogram, LambSquare, and the grad op types of the differentiable
ones.

float16 inputs are computed in float32 and rounded once at the end.
"""
from __future__ import annotations

import numpy as np

from ._blocks import as_f32
from ._util import F16, F32, np_dtype, to_f16, without_out
from .registry import kernel

__all__ = []


def _calc(dt: np.dtype) -> np.dtype:
    return F32 if dt == F16 else dt


def _keep_shape(in_shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(in_shape))


def _finish(out_dt: np.dtype):
    """Round a result to the output dtype (float -> int truncates toward zero)."""
    if out_dt.kind in "iub":
        return lambda r: np.asarray(np.trunc(r) if np.asarray(r).dtype.kind == "f" else r,
                                    dtype=out_dt)
    return lambda r: np.asarray(r, dtype=out_dt)


def _reduce(body):
    """Factory of a reduction `body(x_calc, axes, keep) -> result`."""

    def factory(attrs, ins, outs):
        axes = tuple(attrs["axes"])
        keep = bool(attrs.get("keepdims", False))
        calc = _calc(np_dtype(ins[0]))
        fin = _finish(np_dtype(outs[0]))

        def run(x):
            return fin(body(x.astype(calc, copy=False), axes, keep))
        return run
    return factory


def _mean(x, axes, keep):
    return np.mean(x, axis=axes, keepdims=keep, dtype=np.float64 if x.dtype.kind in "iub"
                   else None)


def _logsumexp(x, axes, keep):
    if not axes or x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axes, keepdims=keep))
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return r if keep else np.squeeze(r, axis=axes)


kernel("ReduceMean")(_reduce(_mean))
kernel("ReduceMax")(_reduce(lambda x, a, k: np.max(x, axis=a, keepdims=k)))
kernel("ReduceMin")(_reduce(lambda x, a, k: np.min(x, axis=a, keepdims=k)))
kernel("ReduceProd")(_reduce(lambda x, a, k: np.prod(x, axis=a, keepdims=k)))
kernel("ReduceSumSquare")(_reduce(lambda x, a, k: np.sum(x * x, axis=a, keepdims=k)))
kernel("ReduceL1")(_reduce(lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k)))
kernel("ReduceL2")(_reduce(lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k))))
kernel("ReduceLogSum")(_reduce(lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k))))
kernel("ReduceLogSumExp")(_reduce(_logsumexp))


def _move_reduced_last(in_shape, axes):
    """(perm, kept_shape, n): transpose moving `axes` last, the kept dims and the reduced count."""
    kept = [i for i in range(len(in_shape)) if i not in axes]
    perm = tuple(kept + list(axes))
    n = 1
    for a in axes:
        n *= in_shape[a]
    return perm, tuple(in_shape[i] for i in kept), n


@kernel("ReduceMedian")
def _reduce_median(attrs, ins, outs):
    axes = tuple(attrs["axes"])
    perm, kept, n = _move_reduced_last(ins[0].shape, axes)
    shape = outs[0].shape
    mid = (n - 1) // 2
    dt = np_dtype(outs[0])

    def run(x):
        flat = x.transpose(perm).reshape(kept + (n,))
        idx = np.argsort(flat, axis=-1, kind="stable")[..., mid:mid + 1]
        vals = np.take_along_axis(flat, idx, axis=-1)
        return vals.reshape(shape).astype(dt, copy=False), idx.reshape(shape).astype(np.int32)
    return run


def _arg(fn):
    def factory(attrs, ins, outs):
        axis = int(attrs["axis"])
        keep = bool(attrs.get("keepdims", False))

        def run(x):
            r = fn(x, axis=axis)
            if keep:
                r = np.expand_dims(r, axis)
            return np.asarray(r, dtype=np.int32)
        return run
    return factory


kernel("ArgMax")(_arg(np.argmax))
kernel("ArgMin")(_arg(np.argmin))


@kernel("TopK")
def _topk(attrs, ins, outs):
    axis, k, largest = int(attrs["axis"]), int(attrs["k"]), bool(attrs["largest"])
    key_dt = np.float64 if np_dtype(ins[0]).kind in "iub" else None

    def run(x):
        key = x.astype(key_dt) if key_dt is not None else x
        order = np.argsort(-key if largest else key, axis=axis, kind="stable")
        idx = np.take(order, np.arange(k), axis=axis)
        return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)
    return run


@kernel("TopKGrad")
def _topk_grad(attrs, ins, outs):
    """(dy, indices) -> dx: dy scattered to the selected positions, zeros elsewhere."""
    axis = int(attrs["axis"])
    shape, dt = outs[0].shape, np_dtype(outs[0])

    def run(dy, idx):
        dx = np.zeros(shape, dt)
        np.put_along_axis(dx, idx.astype(np.intp), dy, axis=axis)
        return dx
    return run


def _cumsum_factory(reverse_default: bool):
    def factory(attrs, ins, outs):
        axis = int(attrs["axis"])
        reverse = bool(attrs.get("reverse", reverse_default))
        dt = np_dtype(outs[0])
        calc = _calc(dt)
        sl = (slice(None),) * axis + (slice(None, None, -1),)

        if reverse:
            return lambda x: np.cumsum(x[sl], axis=axis, dtype=calc)[sl].astype(dt, copy=False)
        return lambda x: np.cumsum(x, axis=axis, dtype=calc).astype(dt, copy=False)
    return factory


kernel("CumSum")(_cumsum_factory(False))
kernel("CumSumGrad")(_cumsum_factory(True))


@kernel("Histogram")
def _histogram(attrs, ins, outs):
    levels = np.asarray(attrs["levels"], dtype=np.float64)
    absolute = bool(attrs["absolute_of_input"])
    nbins = len(levels) + 1

    def run(x):
        v = x.reshape(-1).astype(np.float64)
        if absolute:
            v = np.abs(v)
        bins = np.searchsorted(levels, v, side="right")
        return np.bincount(bins, minlength=nbins).astype(np.uint32)
    return run


@kernel("LambSquare")
def _lamb_square(attrs, ins, outs):
    def run(x):
        x = x.astype(F32, copy=False)
        return np.asarray(np.dot(x.reshape(-1), x.reshape(-1)), dtype=F32)
    return run


# --- grad op types: inputs (dy, x, y) with the forward attrs ------------------------------------
def _reduce_grad(body, n_inputs: int = 3):
    """Grad kernel factory: `body(dy_b, x, y_b) -> dx`, dy and y reshaped to keep-dims shape."""

    def factory(attrs, ins, outs):
        axes = tuple(attrs["axes"])
        in_shape = outs[0].shape
        keep = _keep_shape(in_shape, axes)
        dt = np_dtype(outs[0])
        calc = _calc(dt)

        def run(dy, x, *rest):
            dyb = dy.astype(calc, copy=False).reshape(keep)
            xc = x.astype(calc, copy=False)
            yb = rest[0].astype(calc, copy=False).reshape(keep) if rest else None
            r = body(dyb, xc, yb)
            return np.broadcast_to(r, in_shape).astype(dt)
        return run
    return factory


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


kernel("ReduceMaxGrad")(_reduce_grad(lambda dy, x, y: np.where(x == y, dy, 0)))
kernel("ReduceMinGrad")(_reduce_grad(lambda dy, x, y: np.where(x == y, dy, 0)))
kernel("ReduceSumSquareGrad")(_reduce_grad(lambda dy, x, y: 2 * x * dy))
kernel("ReduceL1Grad")(_reduce_grad(lambda dy, x, y: np.sign(x) * dy))
kernel("ReduceL2Grad")(_reduce_grad(lambda dy, x, y: _safe_div(x, y) * dy))
kernel("ReduceLogSumGrad")(_reduce_grad(lambda dy, x, y: dy * np.exp(-y)))
kernel("ReduceLogSumExpGrad")(_reduce_grad(lambda dy, x, y: dy * np.exp(x - y)))


@kernel("ReduceProdGrad")
def _reduce_prod_grad(attrs, ins, outs):
    """(dy, x) -> dy * product of the other reduced elements (exact with zeros in x)."""
    axes = tuple(attrs["axes"])
    in_shape = outs[0].shape
    perm, kept, n = _move_reduced_last(in_shape, axes)
    inv = tuple(np.argsort(perm))
    moved_shape = tuple(in_shape[p] for p in perm)
    dt = np_dtype(outs[0])
    calc = _calc(dt)

    def run(dy, x):
        f = x.astype(calc).transpose(perm).reshape(kept + (n,))
        ones = np.ones(kept + (1,), calc)
        before = np.cumprod(np.concatenate([ones, f[..., :-1]], axis=-1), axis=-1)
        after = np.cumprod(np.concatenate([ones, f[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
        others = before * after * dy.astype(calc).reshape(kept + (1,))
        return others.reshape(moved_shape).transpose(inv).astype(dt)
    return run


@kernel("ReduceMedianGrad")
def _reduce_median_grad(attrs, ins, outs):
    """(dy, indices) -> dx: dy at the median element of each reduced group, zeros elsewhere."""
    axes = tuple(attrs["axes"])
    in_shape = outs[0].shape
    perm, kept, n = _move_reduced_last(in_shape, axes)
    inv = tuple(np.argsort(perm))
    moved_shape = tuple(in_shape[p] for p in perm)
    dt = np_dtype(outs[0])

    def run(dy, idx):
        dx = np.zeros(kept + (n,), dt)
        np.put_along_axis(dx, idx.astype(np.intp).reshape(kept + (1,)), dy.reshape(kept + (1,)),
                          axis=-1)
        return dx.reshape(moved_shape).transpose(inv).copy()
    return run


@kernel("ReduceSum", writes_out=True)
def _reduce_sum(attrs, ins, outs):
    axes = tuple(attrs["axes"])
    keep = bool(attrs.get("keepdims", False))
    out = np_dtype(outs[0])
    if out == F16:
        def run16(x, out=None):
            return to_f16(np.sum(as_f32(x, "rsum_x"), axis=axes, keepdims=keep, dtype=F32), out)
        return run16
    if np_dtype(ins[0]) == out and out.kind == "f":
        def run(x, out=None):           # (one thread: see `_blocks.column_sums`)
            if out is None:
                return np.asarray(np.sum(x, axis=axes, keepdims=keep), dtype=out_dt)
            return np.sum(x, axis=axes, keepdims=keep, out=out)
        out_dt = out
        return run
    return without_out(lambda x: np.asarray(np.sum(x, axis=axes, keepdims=keep), dtype=out))
