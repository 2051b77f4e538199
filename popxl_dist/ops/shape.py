"""Builders: reshape(_), flatten(_), transpose(_), squeeze, slice(_), subsample, split, concat(_),
gather family, scatter(_reduce), dynamic_slice, dynamic_update(_) and onehot; `expand` (no
popxl.ops name: grad rules use it).
"""
from __future__ import annotations

from typing import List, Literal, Optional, Sequence, Tuple, Union

import numpy as np
from popart._internal._types import ScatterReduction

from .._ir.records import TensorKind
from ..errors import OpSetupError
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["reshape", "reshape_", "flatten", "flatten_", "transpose", "transpose_", "squeeze",
           "slice", "slice_", "subsample", "split", "concat", "concat_", "gather", "tied_gather",
           "groupedgather", "scatter", "scatter_reduce", "grouped_scatter_reduce", "dynamic_slice",
           "dynamic_update", "dynamic_update_", "onehot"]

INT_MIN = -2 ** 31          # upstream's "to the start / end" slice bounds
INT_MAX = 2 ** 31 - 1

IntOrList = Optional[Union[int, Sequence[int]]]


def _shape_entry(s) -> bool:
    return isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_))


def _reshape_shape(t: Tensor, shape: Sequence[int], opname: str) -> Tuple[int, ...]:
    """The new shape of `t`, checked as upstream: a tuple or list of ints, each > 0 or -1, at
    most one -1, keeping the element count."""
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{opname}: shape must be a tuple or list of ints, got "
                        f"{type(shape).__name__} {shape!r}"
                        + (" (use tuple(shape))" if isinstance(shape, np.ndarray) else ""))
    if not all(_shape_entry(s) for s in shape) or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"Invalid shape value in reshape. Must be '>0' or '-1'. Provided "
                         f"{tuple(shape)}. ({opname} of '{t.id}' {t.shape})")
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"Reshape shape can contain at most one '-1' value. Provided {shape}. "
                         f"({opname} of '{t.id}' {t.shape})")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if -1 in shape:
        if t.nelms % known:
            raise ValueError(f"{opname}: cannot reshape '{t.id}' {t.shape} ({t.nelms} elements) "
                             f"to {shape}")
        shape = tuple(t.nelms // known if s == -1 else s for s in shape)
    elif known != t.nelms:
        raise ValueError(f"{opname}: cannot reshape '{t.id}' {t.shape} ({t.nelms} elements) to "
                         f"{shape} ({known} elements)")
    return shape


def reshape_handle_negative_axis(t: Tensor, shape: Sequence[int]) -> Tuple[int, ...]:
    """`shape` with its -1 entry (if any) replaced by the size that keeps `t`'s element count."""
    return _reshape_shape(t, shape, "reshape")


def reshape(t: Tensor, shape: Sequence[int]) -> Tensor:
    """`t` with a new shape (one entry may be -1)."""
    check_tensor(t, "reshape", "t")
    s = _reshape_shape(t, shape, "reshape")
    return add_op("Reshape", "reshape", [t], [Out(f"{t.name}_reshaped", s, t.dtype)])[0]


def reshape_(t: Tensor, shape: Sequence[int]) -> Tensor:
    """A reshaped view of `t`: in-place writes to it reach `t`."""
    check_tensor(t, "reshape_", "t")
    s = _reshape_shape(t, shape, "reshape_")
    return add_op("ReshapeInplace", "reshape_inplace", [t],
                  [Out(f"{t.name}_reshaped", s, t.dtype)])[0]


def flatten(t: Tensor) -> Tensor:
    """`t` as a 1-D tensor."""
    return reshape(t, (-1,)) if t.shape else reshape(t, (1,))


def flatten_(t: Tensor) -> Tensor:
    """A 1-D view of `t`."""
    return reshape_(t, (-1,)) if t.shape else reshape_(t, (1,))


def _perm(t: Tensor, permutation: Optional[Sequence[int]], opname: str) -> Tuple[int, ...]:
    if permutation is None:
        return tuple(reversed(range(t.rank)))
    too_big = tuple(p for p in permutation if isinstance(p, (int, np.integer)) and p >= t.rank)
    if too_big:
        raise ValueError(f"Values in permutation must be less than the tensor's rank {t.rank}. "
                         f"Found {too_big} ({opname} of '{t.id}' {t.shape})")
    perm = tuple(int(p) % max(t.rank, 1) if int(p) < 0 else int(p) for p in permutation)
    if sorted(perm) != list(range(t.rank)):
        raise ValueError(f"{opname}: permutation {tuple(permutation)} is not a permutation of "
                         f"the {t.rank} axes of '{t.id}' {t.shape}")
    return perm


def transpose(t: Tensor, permutation: Optional[Sequence[int]] = None) -> Tensor:
    """Permute the axes of `t` (default: reverse them)."""
    check_tensor(t, "transpose", "t")
    perm = _perm(t, permutation, "transpose")
    shape = tuple(t.shape[p] for p in perm)
    return add_op("Transpose", "transpose", [t], [Out(f"{t.name}_T", shape, t.dtype)],
                  {"perm": perm})[0]


def transpose_(t: Tensor, permutation: Optional[Sequence[int]] = None) -> Tensor:
    """A transposed view of `t`."""
    check_tensor(t, "transpose_", "t")
    perm = _perm(t, permutation, "transpose_")
    shape = tuple(t.shape[p] for p in perm)
    return add_op("TransposeInplace", "transpose_inplace", [t],
                  [Out(f"{t.name}_T", shape, t.dtype)], {"perm": perm})[0]


def expand(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """Broadcast `t` to `shape` (a real copy). Not part of popxl.ops (upstream has no builder
    for it); grad rules use it."""
    check_tensor(t, "expand", "t")
    return add_op("Expand", "expand", [t], [Out("expand_out", tuple(shape), t.dtype)])[0]


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _axis(opname: str, t: Tensor, axis, extra: int = 0) -> int:
    """`axis` of `t` (negative allowed) as a non-negative int; `extra` widens the range."""
    if not _is_int(axis):
        raise TypeError(f"{opname}: axis must be an int, got {axis!r}")
    rank = t.rank + extra
    if not -rank <= int(axis) < rank:
        raise ValueError(f"{opname}: axis {axis} is out of range for '{t.id}' {t.shape}")
    return int(axis) % rank


def _check_int_tensor(opname: str, t: Tensor, argname: str) -> None:
    check_tensor(t, opname, argname)
    if not t.dtype.is_int:
        raise TypeError(f"{opname}: '{argname}' ('{t.id}') must be an integer tensor, got "
                        f"{t.dtype.name}")


# --- squeeze ------------------------------------------------------------------------------
def squeeze(t: Tensor, axes: IntOrList = None) -> Tensor:
    """Drop size-1 axes of `t` (all of them when `axes` is None; given axes must have size 1)."""
    check_tensor(t, "squeeze", "t")
    if axes is None:
        drop = {i for i, s in enumerate(t.shape) if s == 1}
    else:
        given = [axes] if _is_int(axes) else list(axes)
        for a in given:
            if not _is_int(a):
                raise TypeError(f"squeeze: axes must be ints, got {axes!r}")
        norm = [int(a) + t.rank if int(a) < 0 else int(a) for a in given]
        if len(set(norm)) < len(norm):
            raise ValueError(f"Axes contains duplicates (squeeze: {axes!r})")
        drop = set()
        for a in sorted(norm, reverse=True):
            if not 0 <= a < t.rank:
                raise ValueError(f"Can't squeeze axis '{a}' as tensor has rank '{t.rank}' "
                                 f"('{t.id}' {t.shape})")
            if t.shape[a] != 1:
                raise ValueError(f"Can't squeeze axis '{a}' as length of axis is >1: "
                                 f"{t.shape[a]} ('{t.id}' {t.shape})")
            drop.add(a)
    shape = tuple(s for i, s in enumerate(t.shape) if i not in drop)
    return add_op("Reshape", "squeeze", [t], [Out(f"{t.name}_squeezed", shape, t.dtype)])[0]


# --- slice --------------------------------------------------------------------------------
def _as_list(opname: str, name: str, x) -> Optional[List[int]]:
    if x is None:
        return None
    try:
        xs = [x] if _is_int(x) else list(x)
    except TypeError:
        raise TypeError(f"{opname}: {name} must be ints or lists of ints, got {x!r}") from None
    for v in xs:
        if not _is_int(v):
            raise TypeError(f"{opname}: {name} must be ints or lists of ints, got {x!r}")
    return [int(v) for v in xs]


def _onnx_range(dim: int, start: int, stop: int, step: int) -> Tuple[int, Optional[int], int, int]:
    """ONNX Slice clamping for one axis: (start, python stop or None, step, length)."""
    s = start + dim if start < 0 else start
    e = stop + dim if stop < 0 else stop
    if step > 0:
        s = min(max(s, 0), dim)
        e = min(max(e, 0), dim)
        n = max(0, (e - s + step - 1) // step)
    else:
        s = min(max(s, 0), dim - 1)
        e = min(max(e, -1), dim - 1)
        n = max(0, (s - e - step - 1) // -step) if dim else 0
    return s, (None if e < 0 else e), step, n


def process_args(start: IntOrList = None, stop: IntOrList = None, step: IntOrList = None,
                 axis: IntOrList = None) -> Tuple[List[int], List[int], List[int], List[int]]:
    """Normalise slice arguments (see `_process_args`)."""
    return _process_args(start, stop, step, axis, "slice")


def _process_args(start: IntOrList, stop: IntOrList, step: IntOrList, axis: IntOrList,
                  opname: str) -> Tuple[List[int], List[int], List[int], List[int]]:
    """Normalise slice arguments to equal-length lists (start, stop, step, axis): scalars become
    lists; `axis` defaults to the first axes, `step` to 1, `start` to 0 (-1 for a negative step)
    and `stop` to INT_MAX (INT_MIN for a negative step)."""
    lists = {"start": _as_list(opname, "start", start), "stop": _as_list(opname, "stop", stop),
             "step": _as_list(opname, "step", step), "axis": _as_list(opname, "axis", axis)}
    lens = {k: len(v) for k, v in lists.items() if v is not None}
    if not lens:
        raise ValueError(f"{opname}: give at least one of start, stop, step and axis")
    if len(set(lens.values())) > 1:
        k, n = max(lens.items(), key=lambda kv: kv[1])
        bad = next(name for name, m in lens.items() if m != n)
        raise ValueError(f"All inputs must have same length. `{bad}` has length {lens[bad]} != "
                         f"{n}. ({opname}: start, stop, step and axis {lens})")
    n = next(iter(lens.values()))
    axes = lists["axis"] if lists["axis"] is not None else list(range(n))
    steps = lists["step"] if lists["step"] is not None else [1] * n
    if any(s == 0 for s in steps):
        raise ValueError(f"{opname}: step must not be 0, got {steps}")
    starts = lists["start"] if lists["start"] is not None else [0 if s > 0 else -1 for s in steps]
    stops = lists["stop"] if lists["stop"] is not None else [INT_MAX if s > 0 else INT_MIN
                                                              for s in steps]
    return starts, stops, steps, axes


def _slice_spec(opname: str, t: Tensor, start, stop, step, axis):
    """(slices, out_shape): slices is a tuple of (axis, start, stop, step) per sliced axis."""
    starts, stops, steps, axes = _process_args(start, stop, step, axis, opname)
    axes = [_axis(opname, t, a) for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{opname}: repeated axis in {axes}")
    shape = list(t.shape)
    slices = []
    for a, b, e, s in zip(axes, starts, stops, steps):
        b2, e2, s2, length = _onnx_range(t.shape[a], b, e, s)
        slices.append((a, b2, e2, s2))
        shape[a] = length
    return tuple(slices), tuple(shape)


def slice(t: Tensor, start: IntOrList = None, stop: IntOrList = None, step: IntOrList = None,
          axis: IntOrList = None) -> Tensor:
    """ONNX Slice with clamping: `t[start:stop:step]` on each listed axis.

    Scalars are promoted to lists; all given lists must have the same length; `axis` defaults
    to the first axes. A missing start is 0 (-1 for a negative step), a missing stop runs to the
    end. If start, stop and step are all None, `t` itself is returned and no op is added.
    """
    check_tensor(t, "slice", "t")
    if start is None and stop is None and step is None:
        return t
    slices, shape = _slice_spec("slice", t, start, stop, step, axis)
    return add_op("Slice", "slice", [t], [Out("slice_out", shape, t.dtype)],
                  {"slices": slices})[0]


def slice_(t: Tensor, start: IntOrList = None, stop: IntOrList = None, step: IntOrList = None,
           axis: IntOrList = None) -> Tensor:
    """Like `slice`, but the output is a view of `t` (later in-place writes reach `t`)."""
    check_tensor(t, "slice_", "t")
    if start is None and stop is None and step is None:
        return t
    slices, shape = _slice_spec("slice_", t, start, stop, step, axis)
    return add_op("SliceInplace", "slice_inplace", [t],
                  [Out("slice_inplace_out", shape, t.dtype)], {"slices": slices})[0]


def subsample(t: Tensor, strides: Union[int, Sequence[int]]) -> Tensor:
    """`t[::s0, ::s1, ...]`; `strides` is padded with 1s to the rank of `t`."""
    check_tensor(t, "subsample", "t")
    st = _as_list("subsample", "strides", strides)
    if len(st) > t.rank:
        raise ValueError(f"The length of subsample `strides` must not be greater than the rank "
                         f"of the input tensor. ({len(st)} strides for '{t.id}' of rank "
                         f"{t.rank})")
    if any(s < 1 for s in st):
        raise ValueError(f"subsample: strides must be >= 1, got {st}")
    st = st + [1] * (t.rank - len(st))
    shape = tuple(-(-d // s) for d, s in zip(t.shape, st))
    return add_op("Subsample", "subsample", [t], [Out("subsample_out", shape, t.dtype)],
                  {"strides": tuple(st)})[0]


# --- split / concat -----------------------------------------------------------------------
def split(t: Tensor, splits: Union[int, List[int]], axis: int = 0) -> List[Tensor]:
    """Split `t` along `axis` into `splits` equal parts (an int) or parts of the given sizes.

    Outputs are named `<name>_split_<i>`.
    """
    check_tensor(t, "split", "t")
    ax = _axis("split", t, axis)
    dim = t.shape[ax]
    if _is_int(splits):
        k = int(splits)
        if k < 1 or dim % k:
            raise ValueError(f"Split {k} does not equally divide tensor axis {ax} of length "
                             f"{dim}. ('{t.id}' {t.shape})")
        sizes = [dim // k] * k
    else:
        sizes = _as_list("split", "splits", splits)
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise OpSetupError(f"split: sizes {sizes} must be >= 0 and sum to {dim} (axis {ax} "
                               f"of '{t.id}' {t.shape})")
    outs = []
    for i, s in enumerate(sizes):
        shape = t.shape[:ax] + (s,) + t.shape[ax + 1:]
        outs.append(Out(f"{t.name}_split_{i}", shape, t.dtype))
    return add_op("Split", "split", [t], outs, {"axis": ax, "splits": tuple(sizes)})


def _concat_shape(opname: str, ts: Sequence[Tensor], axis: int):
    if isinstance(ts, Tensor):
        raise TypeError(f"{opname}: 'ts' must be a list of tensors, got the tensor '{ts.id}'")
    ts = list(ts)
    if not ts:
        raise ValueError(f"{opname}: needs a non-empty list of tensors")
    for i, t in enumerate(ts):
        check_tensor(t, opname, f"ts[{i}]")
    d = ts[0].dtype
    if any(t.dtype != d for t in ts):
        raise TypeError(f"All inputs to a concat operation must have the same type: "
                        f"{[t.dtype for t in ts]} ({opname}: "
                        + ", ".join(f"'{t.id}' {t.dtype.name}" for t in ts) + ")")
    ax = _axis(opname, ts[0], axis)
    base = ts[0].shape
    total = 0
    for t in ts:
        if t.rank != len(base) or any(a != b for i, (a, b) in enumerate(zip(t.shape, base))
                                      if i != ax):
            raise OpSetupError(f"{opname}: shapes must match except on axis {ax}, got "
                               + ", ".join(f"'{x.id}' {x.shape}" for x in ts))
        total += t.shape[ax]
    return ts, base[:ax] + (total,) + base[ax + 1:], ax


def concat(ts: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Concatenate `ts` (same dtype, same shape except on `axis`) along `axis`."""
    ts, shape, ax = _concat_shape("concat", ts, axis)
    return add_op("Concat", "concat", ts, [Out("concat_out", shape, ts[0].dtype)],
                  {"axis": ax})[0]


def concat_(ts: Sequence[Tensor], axis: int = 0) -> Tensor:
    """In-place (non-modifying) concat. Upstream aliases the inputs; the emulator returns a fresh
    concatenation, which is the same value (a later in-place write to the result does not reach
    the inputs here)."""
    ts, shape, ax = _concat_shape("concat_", ts, axis)
    return add_op("ConcatInplace", "concat_inplace", ts,
                  [Out("concat_inplace_out", shape, ts[0].dtype)], {"axis": ax})[0]


# --- gather / scatter ---------------------------------------------------------------------
def _gather(op_type: str, opname: str, t: Tensor, indices: Tensor, axis: int, group_size: int,
            zero_OOR: bool) -> Tensor:
    check_tensor(t, opname, "t")
    _check_int_tensor(opname, indices, "indices")
    ax = _axis(opname, t, axis)
    if not _is_int(group_size) or group_size < 1:
        raise ValueError(f"{opname}: group_size must be an int >= 1, got {group_size!r}")
    if group_size > 1:
        if ax == 0:
            raise ValueError(f"{opname}: axis 0 is the group axis; gather along an axis >= 1")
        if t.shape[0] != group_size or indices.rank < 1 or indices.shape[0] != group_size:
            raise ValueError(f"{opname}: 't' '{t.id}' {t.shape} and 'indices' '{indices.id}' "
                             f"{indices.shape} must both have group_size={group_size} as "
                             f"their leading dimension")
        shape = (group_size,) + t.shape[1:ax] + indices.shape[1:] + t.shape[ax + 1:]
    else:
        shape = t.shape[:ax] + indices.shape + t.shape[ax + 1:]
    return add_op(op_type, opname, [t, indices], [Out(f"{opname}_out", shape, t.dtype)],
                  {"axis": ax, "group_size": int(group_size), "zero_OOR": bool(zero_OOR)})[0]


def gather(t: Tensor, indices: Tensor, axis: int = 0,
           available_memory_proportion: Optional[float] = None, zero_OOR: bool = False) -> Tensor:
    """`np.take(t, indices, axis)`.

    Out-of-range indices give zeros: upstream documents undefined data without `zero_OOR` and
    zeros with it; the emulator gives zeros in both cases (deterministic on every backend) and
    never raises at run time. Without `zero_OOR`, negative indices from -dim count from the end
    (NumPy); with it, every negative index is out of range (as on the IPU). The gradient of an
    out-of-range row is dropped.
    """
    return _gather("Gather", "gather", t, indices, axis, 1, zero_OOR)


def tied_gather(t: Tensor, indices: Tensor, axis: int = 0,
                available_memory_proportion: Optional[float] = None,
                zero_OOR: bool = False) -> Tensor:
    """Numerically `gather` (upstream ties its layout to a matmul weight)."""
    return _gather("TiedGather", "tied_gather", t, indices, axis, 1, zero_OOR)


def groupedgather(t: Tensor, indices: Tensor, axis: int = 0, group_size: int = 1,
                  available_memory_proportion: Optional[float] = None,
                  zero_OOR: bool = False) -> Tensor:
    """Per-group gather: `out[g] = np.take(t[g], indices[g], axis - 1)` for g < group_size.

    The leading dimension of `t` and `indices` is the group; `axis` is an axis of `t` (>= 1).
    With group_size 1 this is `gather`.
    """
    return _gather("Gather", "gather", t, indices, axis, group_size, zero_OOR)


def scatter(t: Tensor, indices: Tensor, values: Tensor, axis: int = 0,
            available_memory_proportion: Optional[float] = None) -> Tensor:
    """ONNX ScatterElements: a copy of `t` with `values[i]` written at `indices[i]` along `axis`.

    `indices` and `values` have the same shape and the rank of `t`. With duplicate indices the
    last write wins.
    """
    check_tensor(t, "scatter", "t")
    _check_int_tensor("scatter", indices, "indices")
    check_tensor(values, "scatter", "values")
    if values.dtype != t.dtype:
        raise TypeError(f"scatter: 'values' '{values.id}' {values.dtype.name} must have the dtype "
                        f"of 't' '{t.id}' {t.dtype.name}")
    ax = _axis("scatter", t, axis)
    if indices.shape != values.shape or indices.rank != t.rank or any(
            i > s for d, (i, s) in enumerate(zip(indices.shape, t.shape)) if d != ax):
        raise ValueError(f"scatter: 'indices' '{indices.id}' {indices.shape} and 'values' "
                         f"'{values.id}' {values.shape} must have the same shape, of the rank of "
                         f"'t' '{t.id}' {t.shape} and not larger on the other axes")
    return add_op("Scatter", "scatter", [t, indices, values],
                  [Out("scatter_out", t.shape, t.dtype)], {"axis": ax})[0]


ScatterReductionType = Literal["sum", "min", "max", "none"]
reduction_dict = {"sum": ScatterReduction.Sum, "min": ScatterReduction.Min,
                  "max": ScatterReduction.Max, "none": ScatterReduction.None_}


def scatter_reduce(data: Tensor, indices: Tensor, reduction: str,
                   initial_values: Optional[Tensor] = None, axis: int = 0,
                   axis_size: Optional[int] = None, enable_index_broadcast: bool = True,
                   available_memory_proportion: Optional[float] = None) -> Tensor:
    """Reduce slices of `data` into an output of size `axis_size` along `axis`.

    `out[..., indices[i], ...] (op)= data[..., i, ...]` with op one of "sum", "max", "min" or
    "none" (plain scatter, last write wins). The output starts as `initial_values` when given
    (its size along `axis` sets the output size); else it starts at 0 and, for max/min, positions
    that receive data hold the extremum of that data only. `indices` has the shape of `data`,
    or (with `enable_index_broadcast`) broadcasts to it; a 1-D `indices` runs along `axis`.
    """
    return _scatter_reduce("scatter_reduce", data, indices, reduction, initial_values, axis,
                           axis_size, 1, enable_index_broadcast)


def grouped_scatter_reduce(data: Tensor, indices: Tensor, reduction: str,
                           initial_values: Optional[Tensor] = None, axis: int = 0,
                           axis_size: Optional[int] = None, group_size: int = 1,
                           enable_index_broadcast: bool = True,
                           available_memory_proportion: Optional[float] = None) -> Tensor:
    """`scatter_reduce` done independently for `group_size` groups stacked on dim 0.

    With `group_size` > 1, `data`, `indices` and `initial_values` lead with the group dim of
    size `group_size`, and `axis` (a dim of `data`, not the group dim 0) is scattered within
    each group. `indices` has the shape of `data`, or with `enable_index_broadcast`
    broadcasts to it, is (group_size, data.shape[axis]) (one index list per group) or 1-D (the
    same list for every group). `group_size` 1 is plain `scatter_reduce`.
    """
    return _scatter_reduce("grouped_scatter_reduce", data, indices, reduction, initial_values,
                           axis, axis_size, group_size, enable_index_broadcast)


def _scatter_reduce(opname: str, data: Tensor, indices: Tensor, reduction: str,
                    initial_values: Optional[Tensor], axis: int, axis_size: Optional[int],
                    group_size: int, enable_index_broadcast: bool) -> Tensor:
    check_tensor(data, opname, "data")
    _check_int_tensor(opname, indices, "indices")
    if reduction not in reduction_dict:
        raise ValueError(f"The reduction must be one of {list(reduction_dict)} ({opname}: got "
                         f"{reduction!r})")
    ax = _axis(opname, data, axis)
    if not _is_int(group_size) or group_size < 1:
        raise ValueError(f"{opname}: group_size must be an int >= 1, got {group_size!r}")
    grouped = group_size > 1
    if grouped and (data.rank < 2 or data.shape[0] != group_size or ax == 0):
        raise ValueError(f"{opname}: with group_size {group_size}, 'data' '{data.id}' "
                         f"{data.shape} needs a leading group dim of that size and 'axis' "
                         f"{axis} must not be the group dim 0")
    if initial_values is None and axis_size is None:
        raise ValueError(f"One of initial_values and axis_size must be specified ({opname})")
    if initial_values is not None:
        check_tensor(initial_values, opname, "initial_values")
        if initial_values.dtype != data.dtype or initial_values.rank != data.rank:
            raise ValueError(f"{opname}: 'initial_values' '{initial_values.id}' "
                             f"{initial_values.shape} {initial_values.dtype.name} must have the "
                             f"rank and dtype of 'data' '{data.id}' {data.shape} "
                             f"{data.dtype.name}")
        size = initial_values.shape[ax]
        if axis_size is not None and int(axis_size) != size:
            raise ValueError(f"{opname}: axis_size {axis_size} differs from initial_values' "
                             f"size {size} on axis {ax}")
    else:
        size = int(axis_size)
        if size < 1:
            raise ValueError(f"{opname}: axis_size must be >= 1, got {axis_size}")
    shape = data.shape[:ax] + (size,) + data.shape[ax + 1:]
    if initial_values is not None and initial_values.shape != shape:
        raise ValueError(f"{opname}: 'initial_values' '{initial_values.id}' has shape "
                         f"{initial_values.shape}, expected {shape}")
    if indices.shape != data.shape:
        ok = False
        if enable_index_broadcast:
            if indices.rank == 1 and indices.shape[0] == data.shape[ax]:
                ok = True
            elif grouped and indices.shape == (group_size, data.shape[ax]):
                ok = True
            elif indices.rank == data.rank:
                try:
                    ok = np.broadcast_shapes(indices.shape, data.shape) == data.shape
                except ValueError:
                    ok = False
        if not ok:
            raise ValueError(f"{opname}: 'indices' '{indices.id}' {indices.shape} must have the "
                             f"shape of 'data' '{data.id}' {data.shape}"
                             + (" or broadcast to it" if enable_index_broadcast else ""))
    ins = [data, indices] + ([initial_values] if initial_values is not None else [])
    return add_op("ScatterReduce", opname, ins,
                  [Out(f"{opname}_out", shape, data.dtype)],
                  {"axis": ax, "reduction": reduction, "axis_size": size,
                   "has_initial": initial_values is not None, "group_size": group_size})[0]


# --- dynamic slice / update ---------------------------------------------------------------
def _dynamic_window(opname: str, t: Tensor, index: Tensor, axes, sizes) -> Tuple:
    check_tensor(t, opname, "t")
    _check_int_tensor(opname, index, "index")
    axes = _as_list(opname, "axes", axes)
    sizes = _as_list(opname, "sizes", sizes)
    if len(axes) != len(sizes):
        raise ValueError(f"{opname}: axes {axes} and sizes {sizes} must have the same length")
    if index.shape != (len(axes),) and not (len(axes) == 1 and index.shape in ((), (1,))):
        raise ValueError(f"{opname}: 'index' '{index.id}' must have shape ({len(axes)},), got "
                         f"{index.shape}")
    axes = [_axis(opname, t, a) for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{opname}: repeated axis in {axes}")
    shape = list(t.shape)
    for a, s in zip(axes, sizes):
        if not 0 < s <= t.shape[a]:
            raise ValueError(f"{opname}: size {s} for axis {a} of '{t.id}' {t.shape} must be in "
                             f"[1, {t.shape[a]}]")
        shape[a] = s
    return tuple(axes), tuple(sizes), tuple(shape)


def dynamic_slice(t: Tensor, index: Tensor, axes: List[int], sizes: List[int],
                  no_overlap: bool) -> Tensor:
    """A copy of `t[index_i : index_i + size_i]` on each axis in `axes`; `index` is a runtime
    (uint32) tensor of shape `(len(axes),)`. Starts are clamped to `[0, dim - size]`."""
    axes, sizes, shape = _dynamic_window("dynamic_slice", t, index, axes, sizes)
    return add_op("DynamicSlice", "dynamic_slice", [t, index],
                  [Out("dynamic_slice_out", shape, t.dtype)],
                  {"axes": axes, "sizes": sizes, "no_overlap": bool(no_overlap)})[0]


def _dynamic_update(opname: str, op_type: str, out_name: str, t: Tensor, index: Tensor,
                    t_update: Tensor, axes, sizes, no_overlap: bool) -> Tensor:
    axes, sizes, shape = _dynamic_window(opname, t, index, axes, sizes)
    check_tensor(t_update, opname, "t_update")
    if t_update.dtype != t.dtype:
        raise TypeError(f"{opname}: 't_update' '{t_update.id}' {t_update.dtype.name} must have "
                        f"the dtype of 't' '{t.id}' {t.dtype.name}")
    # A t_update not of the window's shape builds, as upstream; the Session refuses it
    # (session_checks.check_op_setups).
    return add_op(op_type, opname, [t, index, t_update], [Out(out_name, t.shape, t.dtype)],
                  {"axes": axes, "sizes": sizes, "no_overlap": bool(no_overlap)})[0]


def dynamic_update(t: Tensor, index: Tensor, t_update: Tensor, axes: List[int],
                   sizes: List[int], no_overlap: bool) -> Tensor:
    """A copy of `t` with `t_update` written into the window at runtime `index`."""
    return _dynamic_update("dynamic_update", "DynamicUpdate", "dynamic_update_out", t, index,
                           t_update, axes, sizes, no_overlap)


def dynamic_update_(t: Tensor, index: Tensor, t_update: Tensor, axes: List[int],
                    sizes: List[int], no_overlap: bool) -> Tensor:
    """Write `t_update` into `t` in place at runtime `index` (modifying). Returns `t`'s alias."""
    return _dynamic_update("dynamic_update_", "DynamicUpdateInplace",
                           "dynamic_update_inplace_out", t, index, t_update, axes, sizes,
                           no_overlap)


# --- onehot -------------------------------------------------------------------------------
def onehot(t: Tensor, num_classes: Tensor, values: Tensor, axis: int) -> Tensor:
    """ONNX OneHot: `values[1]` where `t == class` and `values[0]` elsewhere, with a new axis of
    size `num_classes` at `axis`. Output dtype = `values` dtype.

    `num_classes` must be a constant scalar tensor: the output shape is fixed when the op is built.
    Negative class ids count from the end; other out-of-range ids give an all-off row.
    """
    check_tensor(t, "onehot", "t")
    check_tensor(num_classes, "onehot", "num_classes")
    check_tensor(values, "onehot", "values")
    if not (t.dtype.is_int or t.dtype.is_floating_point):
        raise TypeError(f"onehot: 't' '{t.id}' must be numeric, got {t.dtype.name}")
    data = num_classes._info.data
    if num_classes._info.kind != TensorKind.CONSTANT or data is None:
        raise ValueError(f"onehot: 'num_classes' '{num_classes.id}' must be a popxl.constant: the "
                         f"emulator needs the number of classes when the op is built")
    if np.size(data) != 1:
        raise ValueError(f"onehot: 'num_classes' '{num_classes.id}' must be a scalar, got shape "
                         f"{np.shape(data)}")
    depth = int(np.asarray(data).reshape(()))
    if depth < 1:
        raise ValueError(f"onehot: num_classes must be >= 1, got {depth}")
    if values.shape != (2,):
        raise ValueError(f"onehot: 'values' '{values.id}' must have shape (2,) [off, on], got "
                         f"{values.shape}")
    ax = _axis("onehot", t, axis, extra=1)
    shape = t.shape[:ax] + (depth,) + t.shape[ax:]
    return add_op("OneHot", "onehot", [t, num_classes, values],
                  [Out("onehot_out", shape, values.dtype)], {"axis": ax, "depth": depth})[0]
