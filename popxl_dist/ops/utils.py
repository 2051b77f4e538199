"""`popxl.ops.utils`: argument helpers op builders share (upstream's module of the same name)."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from .. import dtypes
from ..graph import Graph
from ..tensor import Tensor

__all__ = ["cast_if_needed", "check_in_graph", "check_tensor_ipu_and_tile_set",
           "handle_negative_axis", "convert_optional_float", "convert_optional_int",
           "convert_optional_dtype", "convert_optional_int64_list"]


def cast_if_needed(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """`t` itself if it already has `data_type`, else `ops.cast(t, data_type)`."""
    if t.dtype == data_type:
        return t
    from .misc import cast

    return cast(t, data_type)


def _named(args: Sequence[Any], tensors: dict) -> Iterable:
    for i, t in enumerate(args):
        yield f"arg{i}", t
    for name, ts in tensors.items():
        for t in (ts if isinstance(ts, (list, tuple)) else [ts]):
            yield name, t


def check_in_graph(graph: Graph, *args: Tensor, **tensors: Tensor) -> None:
    """Raise ValueError for any tensor (positional, or keyword `name=tensor` or a list of them)
    that is not in `graph`."""
    for name, t in _named(args, tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"The input `{name}` is not a popxl.Tensor: {t!r}")
        if t not in graph:
            raise ValueError(f"The input tensor `{name}` is not in the current Graph "
                             f"{graph.name!r}: '{t.id}' belongs to graph '{t._graph.id}'")


def check_tensor_ipu_and_tile_set(*args: Tensor, **tensors: Tensor) -> None:
    """Raise ValueError (upstream's wording) unless the tensors that an op builder places (by
    their producers) are on one IPU and one tile set. Tensors without a producer (variables,
    constants, graph inputs) match any: upstream derives theirs from their consumers, which
    this check, run by every binary op builder, does not search."""
    placed = [(name, t._placement(consumers=False)) for name, t in _named(args, tensors)]
    ipus = [(name, ipu) for name, (ipu, _) in placed if ipu is not None]
    for name, ipu in ipus[1:]:
        if ipu != ipus[0][1]:
            raise ValueError(f"The input tensors `{ipus[0][0]}` and `{name}` are located on "
                             f"different IPUs: {ipus[0][1]} != {ipu}.")
    sets = [(name, ts) for name, (_, ts) in placed if ts != "undefined"]
    for name, ts in sets[1:]:
        if ts != sets[0][1]:
            raise ValueError(f"The input tensors `{sets[0][0]}` and `{name}` are located on "
                             f"different tile sets: {sets[0][1]} != {ts}.")


def handle_negative_axis(t: Tensor, axis: int) -> int:
    """`axis` as a non-negative index into `t`'s dims."""
    if not -max(t.rank, 1) <= axis < max(t.rank, 1):
        raise ValueError(f"axis {axis} is out of range for tensor '{t.id}' of rank {t.rank}")
    return axis % max(t.rank, 1)


def convert_optional_float(v: Optional[float]) -> Optional[float]:
    return None if v is None else float(v)


def convert_optional_int(v: Optional[int]) -> Optional[int]:
    return None if v is None else int(v)


def convert_optional_dtype(dt: Optional[Any]) -> Optional[dtypes.dtype]:
    return None if dt is None else dtypes.dtype.as_dtype(dt)


def convert_optional_int64_list(l: Optional[Iterable[int]]):  # noqa: E741 - upstream's name
    return None if l is None else [int(i) for i in l]
