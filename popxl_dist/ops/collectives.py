"""`popxl.ops.collectives`: collectives across replicas (all-reduce, reduce-scatter, all-gather).

`group` is a constant-stride `popxl.ReplicaGrouping` of the current Ir (None = all replicas).
Any stride is accepted (a superset of upstream's Consecutive/Orthogonal groups). Group members
are ordered by ascending replica index, which is also the reduction order.

`op` is one of "add", "mean" (sum / group size), "min", "max", "mul", "and", "or",
"square_add" (sum of squares), and "local" (no reduction, reduce-scatter family only).
Upstream maps "mul" to Mean by mistake (its `OP_MAP`); here "mul" is the documented product,
a conscious fix. "and"/"or" need bool tensors (poplar's logical collectives); everything else
takes float32, float16, int32 and uint32.

The op attributes hold plain numbers only (`op`, `stride`, `group_size`, ...), never the
grouping object, so the IR pickles without the Ir.
"""
from __future__ import annotations

import enum
import math
from typing import Any, List, Literal, Optional, Sequence

from popart import CollectiveOperator

from .. import dtypes
from ..context import gcg
from ..replica_grouping import ReplicaGrouping
from ..errors import UndefinedValue
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor
from .shape import reshape, transpose

__all__ = [
    "CommGroup",
    "CommGroupType",
    "all_reduce",
    "all_reduce_identical_grad_inputs",
    "all_reduce_identical_inputs",
    "replica_sharded_slice",
    "replicated_all_gather",
    "replicated_all_reduce",
    "replicated_all_reduce_",
    "replicated_reduce_scatter",
    "replicated_slice",
]

REDUCE_OPS = ("add", "mean", "min", "max", "mul", "and", "or", "square_add")
CollectiveOps = Literal["add", "mean", "mul", "min", "max", "and", "or", "square_add", "local"]
# The PopART operator of each op name. Upstream maps "mul" to Mean (a bug, see the module doc);
# here it is Mul.
OP_MAP = {"add": CollectiveOperator.Add, "mean": CollectiveOperator.Mean,
          "mul": CollectiveOperator.Mul, "min": CollectiveOperator.Min,
          "max": CollectiveOperator.Max, "and": CollectiveOperator.LogicalAnd,
          "or": CollectiveOperator.LogicalOr, "square_add": CollectiveOperator.SquareAdd,
          "local": CollectiveOperator.Local}
_LOGICAL_OPS = ("and", "or")
_NUMERIC_DTYPES = (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.uint32)
GATHER_MODES = ("auto", "new_axis", "concat", "meta_shape")


class CommGroupType(enum.Enum):
    """Legacy collective group kinds (upstream `_ir.CommGroupType`)."""

    All = 0
    Consecutive = 1
    Orthogonal = 2
    Ungrouped = 3


class CommGroup:
    """Legacy collective group (upstream `_ir.CommGroup`). The collective functions take a
    `ReplicaGrouping` instead; this value class is exported for old code only."""

    def __init__(self, type: CommGroupType = CommGroupType.All, replicaGroupSize: int = 0):
        if not isinstance(type, CommGroupType):
            raise TypeError(f"CommGroup: 'type' must be a CommGroupType, got {type!r}")
        if not isinstance(replicaGroupSize, int) or replicaGroupSize < 0:
            raise ValueError(f"CommGroup: 'replicaGroupSize' must be an int >= 0, got "
                             f"{replicaGroupSize!r}")
        self.type = type
        self.replicaGroupSize = replicaGroupSize

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommGroup):
            return NotImplemented
        return (self.type, self.replicaGroupSize) == (other.type, other.replicaGroupSize)

    def __hash__(self) -> int:
        return hash((self.type, self.replicaGroupSize))

    def __repr__(self) -> str:
        return f"CommGroup(type={self.type}, replicaGroupSize={self.replicaGroupSize})"


def to_collective_op(op: CollectiveOps) -> CollectiveOperator:
    """The `popart.CollectiveOperator` of an op name ("add", "mean", ...)."""
    try:
        return OP_MAP[op]
    except (KeyError, TypeError):
        raise ValueError(f"Not a valid op: {op!r}. Must choose from: "
                         f"{', '.join(OP_MAP)}") from None


# --- argument checks -------------------------------------------------------------------------
def _group_attrs(opname: str, group: ReplicaGrouping | None) -> tuple[int, int]:
    """(stride, group_size) of `group` (None = every replica of the current Ir)."""
    ir = gcg().ir
    if group is None:
        group = ir.replica_grouping()
    if not isinstance(group, ReplicaGrouping):
        raise TypeError(f"{opname}: 'group' must be a popxl.ReplicaGrouping (or None for all "
                        f"replicas), got {type(group).__name__}")
    if group._ir is not ir:
        raise ValueError(f"{opname}: 'group' {group!r} belongs to another Ir than the current "
                         f"graph's")
    if not group.is_const:
        # As upstream: only constant-stride groupings have a GCL representation.
        raise NotImplementedError(
            f"{opname}: {group!r} does not have a constant stride and cannot be used in "
            f"collectives (pass its const_rg, or a constant-stride grouping such as its "
            f"transpose)")
    return group.stride, group.group_size


def _check_op(opname: str, op: Any, t: Tensor, allow_local: bool = False) -> str:
    valid = REDUCE_OPS + (("local",) if allow_local else ())
    if not isinstance(op, str) or op.lower() not in OP_MAP:
        raise ValueError(f"Not a valid op: {op}. Must choose from: {', '.join(OP_MAP)} "
                         f"({opname})")
    if op.lower() not in valid:
        raise ValueError(f"{opname}: op {op!r} is not available here; valid ops are "
                         f"{', '.join(repr(v) for v in valid)}")
    op = op.lower()
    if op in _LOGICAL_OPS:
        if t.dtype != dtypes.bool:
            raise TypeError(f"{opname}: op {op!r} needs a bool tensor; '{t.id}' is "
                            f"{t.dtype.name}")
    else:
        _check_dtype(opname, t, moves_only=op == "local")
    return op


def _check_dtype(opname: str, t: Tensor, moves_only: bool = False) -> None:
    """Reductions take the numeric dtypes; collectives that only move data (gathers, local
    slices) take float8 too (its codes are bytes on the IPU)."""
    allowed = _NUMERIC_DTYPES + (dtypes.FLOAT8_DTYPES if moves_only else ())
    if t.dtype not in allowed:
        raise TypeError(f"{opname}: '{t.id}' has dtype {t.dtype.name}; supported dtypes are "
                        f"{', '.join(d.name for d in allowed)}")


# --- all-reduce ------------------------------------------------------------------------------
def _all_reduce(opname: str, op_type: str, settings: str, t: Tensor, op: str,
                group: ReplicaGrouping | None) -> Tensor:
    check_tensor(t, opname, "t")
    op = _check_op(opname, op, t)
    stride, size = _group_attrs(opname, group)
    attrs: dict[str, Any] = {"op": op, "stride": stride, "group_size": size}
    return add_op(op_type, settings, [t],
                  [Out(f"{t.name}_all_reduce", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def replicated_all_reduce(t: Tensor, op: str = "add",
                          group: ReplicaGrouping | None = None) -> Tensor:
    """Reduce `t` over the replicas of each group; every member gets the result.

    Args:
        t: the tensor to reduce (float32, float16, int32, uint32; bool for "and"/"or").
        op: "add", "mean", "min", "max", "mul", "and", "or" or "square_add".
        group: the replica grouping (None: all replicas).

    Returns:
        A new tensor `<t.name>_all_reduce` of t's shape and dtype. It has no gradient.

    Example:
        >>> g = ops.collectives.replicated_all_reduce(grad, op="mean")
    """
    return _all_reduce("replicated_all_reduce", "ReplicatedAllReduce", "replicated_all_reduce",
                       t, op, group)


def replicated_all_reduce_(t: Tensor, op: str = "add",
                           group: ReplicaGrouping | None = None) -> Tensor:
    """In-place `replicated_all_reduce`: writes the reduction into `t` and returns its alias."""
    return _all_reduce("replicated_all_reduce_", "ReplicatedAllReduceInplace",
                       "replicated_all_reduce_inplace", t, op, group)


# --- reduce-scatter --------------------------------------------------------------------------
def _reduce_scatter(opname: str, t: Tensor, op: str, group: ReplicaGrouping | None,
                    rts: bool) -> Tensor:
    check_tensor(t, opname, "t")
    op = _check_op(opname, op, t, allow_local=True)
    stride, size = _group_attrs(opname, group)
    chunk = -(-t.nelms // size)
    attrs: dict[str, Any] = {"op": op, "stride": stride, "group_size": size,
                             "rts": bool(rts)}
    return add_op("ReplicatedReduceScatter", "replicated_reduce_scatter", [t],
                  [Out(f"{t.name}_reduce_scattered", (chunk,), t.dtype,
                       t.shape if rts else ())], attrs)[0]


def replicated_reduce_scatter(t: Tensor, op: str = "add", group: ReplicaGrouping | None = None,
                              configure_output_for_replicated_tensor_sharding: bool = False
                              ) -> Tensor:
    """Reduce the flattened `t` over each group and give member i the i-th 1-D chunk.

    With n elements and k members, the reduction is zero-padded to k*ceil(n/k) elements and
    cut into k contiguous chunks of ceil(n/k).

    Args:
        t: the tensor to reduce.
        op: a reduction (see `replicated_all_reduce`) or "local" (no reduction: each replica
            takes its chunk of its own `t`).
        group: the replica grouping (None: all replicas).
        configure_output_for_replicated_tensor_sharding: give the output meta_shape `t.shape`
            (an RTS shard that `replicated_all_gather` rebuilds into t's shape).

    Returns:
        The 1-D chunk `<t.name>_reduce_scattered`. Differentiable only for op "local".
    """
    return _reduce_scatter("replicated_reduce_scatter", t, op, group,
                           configure_output_for_replicated_tensor_sharding)


def replica_sharded_slice(t: Tensor, group: ReplicaGrouping | None = None) -> Tensor:
    """This replica's RTS shard of `t` (no reduction): the 1-D chunk index_in_group of the
    flattened, zero-padded `t`, with meta_shape `t.shape`."""
    return _reduce_scatter("replica_sharded_slice", t, "local", group, True)


def replicated_slice(t: Tensor, axis: int = 0, group: ReplicaGrouping | None = None) -> Tensor:
    """Split `t` into group-size equal parts along `axis`; each replica keeps the part at its
    index in the group. As upstream, a part of size 1 drops the axis: the output has one
    dimension less (for `axis` > 0, the remaining leading dimension then moves to `axis`, as
    upstream's rearrangement does).

    Built as upstream: move `axis` to the front, flatten, local reduce-scatter, reshape, move
    the axis back; its gradient therefore comes from those ops (an all-gather).
    """
    opname = "replicated_slice"
    check_tensor(t, opname, "t")
    _check_dtype(opname, t, moves_only=True)
    if not isinstance(axis, int) or not -t.rank <= axis < max(t.rank, 1) or t.rank == 0:
        raise ValueError(f"{opname}: axis {axis!r} is out of range for '{t.id}' {t.shape}")
    axis %= t.rank
    _, size = _group_attrs(opname, group)
    if t.shape[axis] % size:
        raise ValueError(f"Replicated slice must equally divide axis. Axis size: "
                         f"{t.shape[axis]}. Replica group size: {size} ({opname} of '{t.id}' "
                         f"{t.shape} along axis {axis})")
    part = t.shape[axis] // size
    flat = _rearrange_input(t, axis)
    y = _reduce_scatter(opname, flat, "local", group, False)
    if part > 1:
        return _rearrange_output(y, t.shape[:axis] + (part,) + t.shape[axis + 1:], axis)
    rest = t.shape[:axis] + t.shape[axis + 1:]      # the axis dropped (moved order: as is)
    y = reshape(y, rest)
    if axis and len(rest) > 1:                      # upstream moves dim 0 to `axis`
        perm = list(range(1, len(rest)))
        perm.insert(min(axis, len(rest) - 1), 0)
        y = transpose(y, tuple(perm))
    return y


def _rearrange_input(t: Tensor, axis: int) -> Tensor:
    """`t` with `axis` moved to the front, flattened (what a reduce-scatter chunks)."""
    if axis:
        t = transpose(t, (axis,) + tuple(i for i in range(t.rank) if i != axis))
    return reshape(t, (t.nelms,))


def _rearrange_output(y: Tensor, new_shape: tuple, axis: int) -> Tensor:
    """Undo `_rearrange_input`: `y` (flat) as a tensor of `new_shape` with `axis` in place."""
    rank = len(new_shape)
    moved = (new_shape[axis],) + tuple(d for i, d in enumerate(new_shape) if i != axis)
    y = reshape(y, moved)
    if not axis:
        return y
    perm = (axis,) + tuple(i for i in range(rank) if i != axis)
    return transpose(y, tuple(perm.index(i) for i in range(rank)))


# --- all-gather ------------------------------------------------------------------------------
def replicated_all_gather(t: Tensor, axis: int = 0, group: ReplicaGrouping | None = None,
                          output_shape: str = "auto") -> Tensor:
    """Gather `t` from every member of the group (in ascending replica order).

    Args:
        t: the tensor to gather.
        axis: the concatenation axis for `output_shape="concat"`.
        group: the replica grouping (None: all replicas).
        output_shape: "new_axis" -> (k, *t.shape); "concat" -> concatenated along `axis`;
            "meta_shape" -> the flat gather truncated to nelms(t.meta_shape) and reshaped to
            t.meta_shape (rebuilds an RTS shard); "auto" -> "meta_shape" if t has a meta_shape,
            else "concat".

    Returns:
        `<t.name>_all_gathered`. Its gradient is each replica's own part of the output grad.

    Example:
        >>> full = ops.collectives.replicated_all_gather(shard)   # shard.meta_shape == full.shape
    """
    opname = "replicated_all_gather"
    check_tensor(t, opname, "t")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"Axis should be an int. Type: {type(axis)}. Value: {axis}")
    _check_dtype(opname, t, moves_only=True)
    if output_shape not in GATHER_MODES:
        raise ValueError(f"output_shape must equal one of 'new_axis', 'concat', 'meta_shape', "
                         f"'auto'. Value: {output_shape}")
    stride, size = _group_attrs(opname, group)
    mode = output_shape
    if mode == "auto":
        mode = "meta_shape" if t.meta_shape else "concat"
    if mode == "new_axis":
        shape = (size,) + t.shape
        axis = 0
    elif mode == "concat":
        if t.rank == 0:
            raise ValueError(f"{opname}: cannot concatenate the scalar '{t.id}'; use "
                             f"output_shape='new_axis'")
        if not isinstance(axis, int) or not -t.rank <= axis < t.rank:
            raise ValueError(f"{opname}: axis {axis!r} is out of range for '{t.id}' {t.shape}")
        axis %= t.rank
        shape = t.shape[:axis] + (t.shape[axis] * size,) + t.shape[axis + 1:]
    else:
        if not t.meta_shape:
            raise ValueError(f"{opname}: output_shape='meta_shape' needs a tensor with a "
                             f"meta_shape, and '{t.id}' {t.shape} has none")
        shape = tuple(t.meta_shape)
        if t.nelms * size < math.prod(shape):
            raise ValueError(f"{opname}: gathering '{t.id}' {t.shape} over {size} replicas gives "
                             f"{t.nelms * size} elements, fewer than its meta_shape {shape} needs")
        axis = 0
    attrs: dict[str, Any] = {"stride": stride, "group_size": size, "mode": mode, "axis": axis}
    return add_op("ReplicatedAllGather", "replicated_all_gather", [t],
                  [Out(f"{t.name}_all_gathered", shape, t.dtype)], attrs)[0]


# --- all-reduce across the IPUs of one replica -------------------------------------------------
def _all_reduce_ipus(opname: str, ts: Sequence[Tensor], ipus: Optional[Sequence[int]], op: str,
                     identical_inputs: bool, identical_grad_inputs: bool) -> List[Tensor]:
    if isinstance(ts, Tensor) or not isinstance(ts, (list, tuple)) or not ts:
        raise TypeError(f"{opname}: 'ts' must be a non-empty list of popxl.Tensor (one per IPU), "
                        f"got {type(ts).__name__}")
    for i, t in enumerate(ts):
        check_tensor(t, opname, f"ts[{i}]")
    first = ts[0]
    for t in ts[1:]:
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(f"{opname}: every input must have the shape and dtype of "
                             f"'{first.id}' {first.shape} {first.dtype.name}; '{t.id}' is "
                             f"{t.shape} {t.dtype.name}")
    op = _check_op(opname, op, first)
    if ipus is None:
        try:
            ipus = [t.ipu for t in ts]
        except UndefinedValue as e:
            raise ValueError("Could not automatically infer the IPU of all input Tensors `ts`. "
                             "Please specify the IPUs via the `ipus` parameter.") from e
    elif (not isinstance(ipus, (list, tuple))
          or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ipus)):
        raise TypeError(f"{opname}: 'ipus' must be a list of non-negative ints, got {ipus!r}")
    if len(ipus) != len(ts):
        raise ValueError(f"{opname}: {len(ts)} tensors but {len(ipus)} ipus {list(ipus)}")
    if len(set(ipus)) != len(ipus):
        raise ValueError(f"{opname}: each tensor must be on a different IPU, got ipus "
                         f"{list(ipus)}")
    attrs: dict[str, Any] = {"op": op, "ipus": tuple(ipus),
                             "identical_inputs": bool(identical_inputs),
                             "identical_grad_inputs": bool(identical_grad_inputs)}
    outs = add_op("AllReduce", "all_reduce", list(ts),
                  [Out(f"{t.name}_all_reduce", t.shape, t.dtype, t.meta_shape) for t in ts],
                  attrs)
    for o, ipu in zip(outs, ipus):
        o._info.extra["ipu"] = ipu
    return outs


def all_reduce(ts: List[Tensor], ipus: Optional[List[int]] = None,
               op: str = "add") -> List[Tensor]:
    """Reduce tensors held by different IPUs of the same replica (pipeline or tensor
    parallelism within a replica); every output holds the reduction of all inputs.

    Args:
        ts: one tensor per IPU, all of the same shape and dtype.
        ipus: the IPU of each tensor (default: inferred from where each tensor was produced).
        op: "add", "mean", "min", "max", "mul", "and", "or" or "square_add". Only "add" has a
            gradient (the all-reduce of the output gradients).

    Returns:
        One tensor per input, `<name>_all_reduce`, placed on that input's IPU. Reductions run
        in list order with the replicated collectives' fixed tree, so splitting a reduction over
        IPUs or over replicas gives the same bits.

    Example:
        >>> with popxl.ipu(0): a = x0 @ w0
        >>> with popxl.ipu(1): b = x1 @ w1
        >>> a_sum, b_sum = ops.collectives.all_reduce([a, b])
    """
    return _all_reduce_ipus("all_reduce", ts, ipus, op, False, False)


def all_reduce_identical_inputs(ts: List[Tensor], ipus: Optional[List[int]] = None,
                                op: str = "add") -> List[Tensor]:
    """`all_reduce` for inputs known to be identical: the forward pass is an identity (each
    output is its input) and the gradient is the all-reduce of the output gradients (the
    Megatron "f" operator). Arguments as `all_reduce`."""
    return _all_reduce_ipus("all_reduce_identical_inputs", ts, ipus, op, True, False)


def all_reduce_identical_grad_inputs(ts: List[Tensor], ipus: Optional[List[int]] = None,
                                     op: str = "add") -> List[Tensor]:
    """`all_reduce` whose output gradients are known to be identical: the forward pass is the
    all-reduce and the gradient is an identity (the Megatron "g" operator). Arguments as
    `all_reduce`."""
    return _all_reduce_ipus("all_reduce_identical_grad_inputs", ts, ipus, op, False, True)
