"""Kernels: Reshape and Transpose (views) and their in-place aliases, Expand, Slice(Inplace),
Subsample, Split, Concat(Inplace), Gather/TiedGather, Scatter, ScatterReduce, DynamicSlice,
DynamicUpdate(Inplace), OneHot and their grad op types.

`ConcatInplace` is upstream's non-modifying alias of its inputs; here it is a fresh concatenation
(same value; a later in-place write to the result does not reach the inputs).
"""
from __future__ import annotations

import numpy as np

from ..parallel import current_threads
from ._blocks import BLOCK, copy_into
from ._scatter_add import scatter_add_rows
from ._util import F16, F32, as_dtype, np_dtype, without_out
from .registry import kernel

__all__ = []


def _index(rank: int, slices) -> tuple:
    idx = [slice(None)] * rank
    for a, b, e, s in slices:
        idx[a] = slice(b, e, s)
    return tuple(idx)


def _slice_factory(attrs, ins, outs):
    idx = _index(len(ins[0].shape), attrs["slices"])
    return lambda x: x[idx]


kernel("Slice", view=True)(_slice_factory)
kernel("SliceInplace", alias=True)(_slice_factory)


@kernel("SliceGrad")
def _slice_grad(attrs, ins, outs):
    """dy -> zeros of the input shape with dy in the sliced window."""
    shape, dt = outs[0].shape, np_dtype(outs[0])
    idx = _index(len(shape), attrs["slices"])

    def run(dy):
        dx = np.zeros(shape, dt)
        dx[idx] = dy
        return dx
    return run


def _strided(strides) -> tuple:
    return tuple(slice(None, None, int(s)) for s in strides)


@kernel("Subsample", view=True)
def _subsample(attrs, ins, outs):
    idx = _strided(attrs["strides"])
    return lambda x: x[idx]


@kernel("SubsampleGrad")
def _subsample_grad(attrs, ins, outs):
    shape, dt = outs[0].shape, np_dtype(outs[0])
    idx = _strided(attrs["strides"])

    def run(dy):
        dx = np.zeros(shape, dt)
        dx[idx] = dy
        return dx
    return run


@kernel("Split", writes_out=True)
def _split(attrs, ins, outs):
    axis = int(attrs["axis"])
    bounds = np.cumsum(attrs["splits"])[:-1].tolist()

    def run(x, out=None):
        parts = np.split(x, bounds, axis=axis)
        if out is None:
            return tuple(p.copy() for p in parts)
        res = []
        for p, o in zip(parts, out):
            if o is None:
                res.append(p.copy())
            else:
                res.append(copy_into(o, p))
        return tuple(res)
    return run


def _concat_factory(attrs, ins, outs):
    axis = int(attrs["axis"])
    dt = np_dtype(outs[0])
    if any(np_dtype(i) != dt for i in ins):
        return without_out(lambda *xs: np.concatenate(xs, axis=axis))

    def run(*xs, out=None):
        if out is None or out.size <= BLOCK or current_threads() < 2:
            return np.concatenate(xs, axis=axis, out=out)
        lo = 0
        ax = axis % out.ndim
        for x in xs:                        # each part copied into its slice of the output
            hi = lo + x.shape[ax]
            copy_into(out[(slice(None),) * ax + (slice(lo, hi),)], x)
            lo = hi
        return out
    return run


kernel("Concat", writes_out=True)(_concat_factory)
kernel("ConcatInplace", writes_out=True)(_concat_factory)


# --- gather ------------------------------------------------------------------------------
def _in_range(idx: np.ndarray, dim: int, zero_oor: bool) -> np.ndarray:
    """Which indices select a row: [0, dim) with zero_OOR, else [-dim, dim) (NumPy's negative
    indices). The others are out of range: upstream returns undefined data for them (zeros with
    zero_OOR); the emulator returns zeros in both cases and never raises."""
    return (idx >= (0 if zero_oor else -dim)) & (idx < dim)


def _all_in_range(idx: np.ndarray, dim: int, zero_oor: bool) -> bool:
    """`_in_range(...).all()` by two reductions (no temporaries: T5 gathers 512 x 512)."""
    return idx.size == 0 or (int(idx.min()) >= (0 if zero_oor else -dim)
                             and int(idx.max()) < dim)


def _gather_factory(attrs, ins, outs):
    axis = int(attrs["axis"])
    groups = int(attrs.get("group_size", 1))
    zero_oor = bool(attrs.get("zero_OOR", False))
    dim = ins[0].shape[axis]

    def take(x, idx, ax):
        if _all_in_range(idx, dim, zero_oor):
            return np.take(x, idx.astype(np.intp, copy=False), axis=ax)
        ok = _in_range(idx, dim, zero_oor)
        r = np.take(x, np.where(ok, idx, 0).astype(np.intp), axis=ax)
        mask = ok.reshape((1,) * ax + ok.shape + (1,) * (x.ndim - ax - 1))
        return np.where(mask, r, np.zeros((), r.dtype))

    if groups == 1:
        return lambda x, idx: take(x, idx, axis)
    return lambda x, idx: np.stack([take(x[g], idx[g], axis - 1) for g in range(groups)])


kernel("Gather")(_gather_factory)
kernel("TiedGather")(_gather_factory)


@kernel("GatherGrad")
def _gather_grad(attrs, ins, outs):
    """(dy, indices) -> dx: dy scatter-added at the gathered positions (float32 for float16)."""
    axis = int(attrs["axis"])
    groups = int(attrs.get("group_size", 1))
    zero_oor = bool(attrs.get("zero_OOR", False))
    shape, dt = outs[0].shape, np_dtype(outs[0])
    calc = F32 if dt == F16 else dt
    dim = shape[axis]

    def add_into(dx, dy, idx, ax):
        """dx's rows along `ax` += dy's, in index order (the bits of a sequential loop)."""
        idx = idx.astype(np.intp, copy=False).reshape(-1)
        rows = np.moveaxis(dy.reshape(dx.shape[:ax] + (idx.size,) + dx.shape[ax + 1:]), ax, 0)
        if not _all_in_range(idx, dim, zero_oor):   # out-of-range rows: no gradient
            ok = _in_range(idx, dim, zero_oor)
            idx, rows = idx[ok], rows[ok]
        if not zero_oor and idx.size and idx.min() < 0:
            idx = np.where(idx < 0, idx + dim, idx)
        scatter_add_rows(np.moveaxis(dx, ax, 0), idx, as_dtype(rows, calc))

    def run(dy, idx):
        dx = np.zeros(shape, calc)
        if groups == 1:
            add_into(dx, dy, idx, axis)
        else:
            for g in range(groups):
                add_into(dx[g], dy[g], idx[g], axis - 1)
        return as_dtype(dx, dt)
    return run


# --- scatter -----------------------------------------------------------------------------
@kernel("Scatter")
def _scatter(attrs, ins, outs):
    axis = int(attrs["axis"])

    def run(t, idx, values):
        out = t.copy()
        np.put_along_axis(out, idx.astype(np.intp), values, axis=axis)
        return out
    return run


@kernel("ScatterDataGrad")
def _scatter_data_grad(attrs, ins, outs):
    """(dy, indices) -> dy with zeros where the forward op wrote values."""
    axis = int(attrs["axis"])

    def run(dy, idx):
        out = dy.copy()
        np.put_along_axis(out, idx.astype(np.intp), 0, axis=axis)
        return out
    return run


@kernel("ScatterValuesGrad")
def _scatter_values_grad(attrs, ins, outs):
    """(dy, indices) -> dy gathered at the written positions."""
    axis = int(attrs["axis"])
    return lambda dy, idx: np.take_along_axis(dy, idx.astype(np.intp), axis=axis)


def _full_indices(idx, data_shape, axis, group_size=1):
    """Indices broadcast to the data shape (a 1-D index runs along `axis`; with groups, a
    (group_size, n) index runs along `axis` within each group)."""
    idx = idx.astype(np.intp, copy=False)
    rank = len(data_shape)
    if idx.ndim == 1 and rank != 1:
        idx = idx.reshape((1,) * axis + idx.shape + (1,) * (rank - axis - 1))
    elif group_size > 1 and idx.ndim == 2 and rank > 2:
        idx = idx.reshape((idx.shape[0],) + (1,) * (axis - 1) + idx.shape[1:]
                          + (1,) * (rank - axis - 1))
    return np.broadcast_to(idx, data_shape)


def _scatter_target(idx, axis):
    """Index tuple addressing out[..., idx, ...] for every element of the data."""
    grids = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return tuple(grids)


@kernel("ScatterReduce")
def _scatter_reduce(attrs, ins, outs):
    axis, red = int(attrs["axis"]), attrs["reduction"]
    groups = int(attrs.get("group_size", 1))
    has_init = bool(attrs.get("has_initial", False))
    shape, dt = outs[0].shape, np_dtype(outs[0])
    data_shape = ins[0].shape
    calc = F32 if dt == F16 else dt
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}.get(red)

    def run(data, idx, *init):
        target = _scatter_target(_full_indices(idx, data_shape, axis, groups), axis)
        out = init[0].astype(calc) if has_init else np.zeros(shape, calc)
        d = data.astype(calc, copy=False)
        if red == "none":
            out[target] = d
        elif has_init or red == "sum":
            ufunc.at(out, target, d)
        else:
            # no initial values: touched positions hold the reduction of their data only
            hit = np.zeros(shape, bool)
            hit[target] = True
            fill = np.finfo(calc).max if calc.kind == "f" else np.iinfo(calc).max
            tmp = np.full(shape, -fill if red == "max" else fill, calc)
            ufunc.at(tmp, target, d)
            out = np.where(hit, tmp, out)
        return out.astype(dt, copy=False)
    return run


@kernel("ScatterReduceGrad")
def _scatter_reduce_grad(attrs, ins, outs):
    """(dy, data, indices, out) -> d data: dy gathered at each element's target; for max/min
    only elements equal to the result get it (all ties)."""
    axis, red = int(attrs["axis"]), attrs["reduction"]
    groups = int(attrs.get("group_size", 1))
    data_shape = outs[0].shape

    def run(dy, data, idx, out):
        target = _scatter_target(_full_indices(idx, data_shape, axis, groups), axis)
        g = dy[target]
        if red in ("max", "min"):
            g = np.where(data == out[target], g, 0)
        return np.ascontiguousarray(g, dtype=dy.dtype)
    return run


@kernel("ScatterReduceInitGrad")
def _scatter_reduce_init_grad(attrs, ins, outs):
    """(dy, initial_values, indices, out) -> d initial_values."""
    axis, red = int(attrs["axis"]), attrs["reduction"]
    groups = int(attrs.get("group_size", 1))
    data_shape = tuple(attrs["data_shape"])

    def run(dy, init, idx, out):
        if red == "sum":
            return dy.copy()
        if red in ("max", "min"):
            return np.where(init == out, dy, 0).astype(dy.dtype)
        g = dy.copy()
        g[_scatter_target(_full_indices(idx, data_shape, axis, groups), axis)] = 0
        return g
    return run


# --- dynamic slice / update --------------------------------------------------------------
def _window(attrs, shape):
    """fn(index array) -> index tuple of the window, starts clamped to [0, dim - size]."""
    axes, sizes = tuple(attrs["axes"]), tuple(attrs["sizes"])
    limits = [shape[a] - s for a, s in zip(axes, sizes)]
    rank = len(shape)

    def window(index):
        idx = [slice(None)] * rank
        for k, (a, s) in enumerate(zip(axes, sizes)):
            b = int(index.reshape(-1)[k])
            b = 0 if b < 0 else (limits[k] if b > limits[k] else b)
            idx[a] = slice(b, b + s)
        return tuple(idx)
    return window


@kernel("DynamicSlice")
def _dynamic_slice(attrs, ins, outs):
    window = _window(attrs, ins[0].shape)
    return lambda t, index: t[window(index)].copy()


@kernel("DynamicUpdate")
def _dynamic_update(attrs, ins, outs):
    window = _window(attrs, ins[0].shape)

    def run(t, index, upd):
        out = t.copy()
        out[window(index)] = upd
        return out
    return run


@kernel("DynamicUpdateInplace", modifies=(0,))
def _dynamic_update_inplace(attrs, ins, outs):
    window = _window(attrs, ins[0].shape)

    def run(t, index, upd):
        t[window(index)] = upd
        return t
    return run


# --- onehot ------------------------------------------------------------------------------
def _onehot_mask(attrs, idx_shape):
    axis, depth = int(attrs["axis"]), int(attrs["depth"])
    classes = np.arange(depth).reshape((1,) * axis + (depth,) + (1,) * (len(idx_shape) - axis))

    def mask(t):
        i = t.astype(np.int64) if t.dtype.kind != "f" else np.trunc(t).astype(np.int64)
        i = np.where(i < 0, i + depth, i)
        return np.expand_dims(i, axis) == classes
    return mask


@kernel("OneHot")
def _onehot(attrs, ins, outs):
    mask = _onehot_mask(attrs, ins[0].shape)
    return lambda t, depth, values: np.where(mask(t), values[1], values[0])


@kernel("OneHotGrad")
def _onehot_grad(attrs, ins, outs):
    """(dy, t) -> d values = [sum of dy off the classes, sum of dy on them]."""
    mask = _onehot_mask(attrs, ins[1].shape)
    dt = np_dtype(outs[0])

    def run(dy, t):
        m = mask(t)
        d = dy.astype(F32 if dt == F16 else dt, copy=False)
        return np.array([np.sum(d, where=~m), np.sum(d, where=m)], dtype=dt)
    return run


def _reshape_factory(attrs, ins, outs):
    shape = outs[0].shape

    def run(x, out=None):
        """A view of x when its layout allows, else a copy (into `out` when given)."""
        if out is None:
            return x.reshape(shape)
        v = x.view()
        try:
            v.shape = shape
            return v
        except AttributeError:
            copy_into(out.reshape(x.shape), x)
            return out
    return run


kernel("Reshape", view=True, writes_out=True)(_reshape_factory)


@kernel("ReshapeInplace", alias=True)
def _reshape_inplace(attrs, ins, outs):
    """A view of x when NumPy can make one, else a copy (x non-contiguous, e.g. a transpose):
    the compiler then writes changes back between the two (`_AliasPlan.reshape_syncs`)."""
    shape = outs[0].shape
    return lambda x: x.reshape(shape)


def _transpose_factory(attrs, ins, outs):
    perm = tuple(attrs["perm"])
    return lambda x: x.transpose(perm)


kernel("Transpose", view=True)(_transpose_factory)
kernel("TransposeInplace", alias=True)(_transpose_factory)


@kernel("Expand")
def _expand(attrs, ins, outs):
    shape = outs[0].shape
    return lambda x: np.broadcast_to(x, shape).copy()
