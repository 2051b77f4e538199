"""Builders: reductions (sum, mean, max, min, prod, median, sumsquare, l1, l2, logsum,
logsumexp), index reductions (argmax, argmin, topk), cumsum, histogram and lamb_square.

`axis=None` reduces every axis (shape `()` unless `keepdims`); `axis` may be an int or a list with
negative entries. float16 inputs accumulate in float32 and round once (the IPU's partials type).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

from .. import dtypes
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor, normalize_axes

__all__ = ["sum", "mean", "max", "min", "prod", "median", "sumsquare", "l1", "l2", "logsum",
           "logsumexp", "argmax", "argmin", "topk", "cumsum", "histogram", "lamb_square"]

Axis = Optional[Union[int, Sequence[int]]]


def reduce_shape(t: Tensor, axes, keepdims: bool):
    return tuple((1 if i in axes else s) for i, s in enumerate(t.shape) if keepdims or i not in axes)


def reduce_op(op_type: str, settings: str, t: Tensor, axis, keepdims: bool, out_dtype=None) -> Tensor:
    check_tensor(t, settings, "t")
    axes = normalize_axes(settings, axis, t.rank)
    shape = reduce_shape(t, axes, keepdims)
    return add_op(op_type, op_type, [t], [Out(f"{settings}_out", shape, out_dtype or t.dtype)],
                  {"axes": axes, "keepdims": bool(keepdims)})[0]


def sum(t: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Sum over `axis` (all axes when None)."""
    return reduce_op("ReduceSum", "sum", t, axis, keepdims)


def _float_reduce(op_type: str, settings: str, t: Tensor, axis: Axis, keepdims: bool) -> Tensor:
    check_tensor(t, settings, "t")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{settings}: '{t.id}' must be a floating point tensor, got "
                        f"{t.dtype.name}")
    return reduce_op(op_type, settings, t, axis, keepdims)


def mean(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean over `axis` (all axes when None)."""
    return reduce_op("ReduceMean", "mean", t, axis, keepdims)


def max(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over `axis`. Gradient: every element equal to the maximum gets the full `dy`."""
    return reduce_op("ReduceMax", "max", t, axis, keepdims)


def min(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over `axis`. Gradient: every element equal to the minimum gets the full `dy`."""
    return reduce_op("ReduceMin", "min", t, axis, keepdims)


def prod(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product over `axis`."""
    return reduce_op("ReduceProd", "prod", t, axis, keepdims)


def median(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Median over `axis`; for an even count the lower of the two middle values (as PyTorch).

    The op has a second output `median_indices_out` (int32, index into the flattened reduced
    axes) that carries the gradient; only the values are returned.
    """
    check_tensor(t, "median", "t")
    axes = normalize_axes("median", axis, t.rank)
    shape = reduce_shape(t, axes, keepdims)
    return add_op("ReduceMedian", "ReduceMedian", [t],
                  [Out("median_out", shape, t.dtype), Out("median_indices_out", shape,
                                                         dtypes.int32)],
                  {"axes": axes, "keepdims": bool(keepdims)})[0]


def sumsquare(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum of squares over `axis`."""
    return reduce_op("ReduceSumSquare", "sumsquare", t, axis, keepdims)


def l1(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum of absolute values over `axis`."""
    return reduce_op("ReduceL1", "l1", t, axis, keepdims)


def l2(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Euclidean norm sqrt(sum(x^2)) over `axis`."""
    return _float_reduce("ReduceL2", "l2", t, axis, keepdims)


def logsum(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(x)) over `axis`."""
    return _float_reduce("ReduceLogSum", "logsum", t, axis, keepdims)


def logsumexp(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over `axis` (computed stably)."""
    return _float_reduce("ReduceLogSumExp", "logsumexp", t, axis, keepdims)


def _single_axis(opname: str, t: Tensor, dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{opname}: the axis must be an int, got {dim!r}")
    if t.rank == 0 or not -t.rank <= dim < t.rank:
        raise ValueError(f"{opname}: axis {dim} is out of range for '{t.id}' {t.shape}")
    return dim % t.rank


def _arg_reduce(op_type: str, settings: str, t: Tensor, dim: int, keepdim: bool) -> Tensor:
    check_tensor(t, settings, "t")
    axis = _single_axis(settings, t, dim)
    shape = reduce_shape(t, (axis,), keepdim)
    return add_op(op_type, settings, [t], [Out(f"{settings}_out", shape, dtypes.int32)],
                  {"axis": axis, "keepdims": bool(keepdim)})[0]


def argmax(t: Tensor, dim: int = 0, keepdim: bool = False) -> Tensor:
    """int32 index of the maximum along `dim` (the first one on ties)."""
    return _arg_reduce("ArgMax", "argmax", t, dim, keepdim)


def argmin(t: Tensor, dim: int = 0, keepdim: bool = False) -> Tensor:
    """int32 index of the minimum along `dim` (the first one on ties)."""
    return _arg_reduce("ArgMin", "argmin", t, dim, keepdim)


def topk(t: Tensor, k: int, axis: int, largest: bool, sorted: bool,
         available_memory_proportion: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """The `k` largest (or smallest) values along `axis` and their int32 indices.

    Values always come out sorted (best first, ties in index order), also for `sorted=False`,
    where upstream's order is unspecified.

    Returns:
        (values, indices)
    """
    check_tensor(t, "topk", "t")
    ax = _single_axis("topk", t, axis)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"topk: k must be an int, got {k!r}")
    if not 1 <= k <= t.shape[ax]:
        raise ValueError(f"topk: k={k} must be in [1, {t.shape[ax]}] for axis {axis} of "
                         f"'{t.id}' {t.shape}")
    shape = t.shape[:ax] + (k,) + t.shape[ax + 1:]
    vals, idx = add_op("TopK", "topk", [t], [Out("topk_values", shape, t.dtype),
                                              Out("topk_indices", shape, dtypes.int32)],
                       {"axis": ax, "k": k, "largest": bool(largest), "sorted": bool(sorted)})
    return vals, idx


def cumsum(t: Tensor, dim: int = 0) -> Tensor:
    """Inclusive cumulative sum along `dim` (the axis is an attribute, not a constant input)."""
    check_tensor(t, "cumsum", "t")
    ax = _single_axis("cumsum", t, dim)
    return add_op("CumSum", "cumsum", [t], [Out("cumsum_out", t.shape, t.dtype)],
                  {"axis": ax, "reverse": False})[0]


def check_increment(levels: List[float]) -> None:
    """Raise ValueError unless `levels` is strictly increasing (histogram bin edges)."""
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"The input levels `{levels}` is not a monotonically increasing list.")


def histogram(t: Tensor, levels: List[float], absolute_of_input: bool) -> Tensor:
    """uint32 counts of the flattened `t` in `len(levels) + 1` bins.

    Bin 0 counts x < levels[0], bin i counts levels[i-1] <= x < levels[i], the last bin
    x >= levels[-1]. `levels` must be strictly increasing; with `absolute_of_input` |x| is counted.
    """
    check_tensor(t, "histogram", "t")
    if t.dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"histogram: '{t.id}' must be float16 or float32, got {t.dtype.name}")
    lv = [float(x) for x in levels]
    if not lv:
        raise ValueError("histogram: levels must not be empty")
    check_increment(lv)
    return add_op("Histogram", "histogram", [t],
                  [Out("histogram_out", (len(lv) + 1,), dtypes.uint32)],
                  {"levels": tuple(lv), "absolute_of_input": bool(absolute_of_input)})[0]


def lamb_square(t: Tensor) -> Tensor:
    """Sum of squares of every element as a float32 scalar (the LAMB optimizer's norms)."""
    check_tensor(t, "lamb_square", "t")
    return add_op("LambSquare", "lamb_square", [t],
                  [Out("lamb_square_out", (), dtypes.float32)])[0]
