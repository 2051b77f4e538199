"""Builders of the tensor-parallel ops that upstream implements as popxl.addons C++ custom ops.

`popxl_addons` wraps them under upstream's names (`replicated_all_reduce_TP`,
`cross_entropy_sharded_loss`, `layer_norm_distributed`, `grad_reduce_square_add`, ...); they live
here, beside popxl's other builders, because their kernels and grad rules are part of the engine
(`engine/kernels/tensor_parallel.py`, `transforms/grads/tensor_parallel.py`) and the grad rules
build ops with them. Groups are constant-stride `ReplicaGrouping`s of the current Ir, stored as
plain `stride` / `group_size` attributes like every collective.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Union

from .. import dtypes
from ..replica_grouping import ReplicaGrouping
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_float_tensors, check_tensor
from .collectives import REDUCE_OPS, _check_op, _group_attrs

__all__ = ["replicated_all_reduce_identical", "cross_entropy_sharded",
           "cross_entropy_sharded_wr", "layer_norm_distributed", "grad_reduce_square_add",
           "ALL_REDUCE_TP", "ALL_REDUCE_STRIDED", "CE_REDUCTIONS"]

ALL_REDUCE_TP = "ReplicatedAllReduceTP"
ALL_REDUCE_STRIDED = "ReplicatedAllReduceStrided"
CE_REDUCTIONS = ("mean", "sum", "none")
_FLOATS = (dtypes.float32, dtypes.float16)


def replicated_all_reduce_identical(opname: str, op_type: str, t: Tensor, op: str,
                                    group: Optional[ReplicaGrouping], identical_inputs: bool,
                                    identical_grad_inputs: bool,
                                    allowed_ops: Sequence[str] = REDUCE_OPS) -> Tensor:
    """A replicated all-reduce with upstream's `identical_inputs` / `identical_grad_inputs`
    flags (op type `ReplicatedAllReduceTP` or `ReplicatedAllReduceStrided`).

    Forward: the all-reduce, or (identical inputs) an identity that the OpToIdentity pattern
    must put in place before a Session runs the IR. Gradient: the same op with the flags swapped.
    """
    check_tensor(t, opname, "t")
    checked = _check_op(opname, op, t)
    if checked not in allowed_ops:
        raise ValueError(f"{opname}: op must be one of {tuple(allowed_ops)}, got {op!r}")
    stride, size = _group_attrs(opname, group)
    attrs: dict[str, Any] = {"op": checked, "stride": stride, "group_size": size,
                             "identical_inputs": bool(identical_inputs),
                             "identical_grad_inputs": bool(identical_grad_inputs)}
    return add_op(op_type, opname, [t],
                  [Out(f"{t.name}_all_reduce", t.shape, t.dtype, t.meta_shape)], attrs)[0]


# --- sharded cross entropy -------------------------------------------------------------------
def _check_logits_indices(opname: str, logits: Tensor, indices: Tensor,
                          lname: str = "logits", iname: str = "indices") -> None:
    check_float_tensors(opname, _FLOATS, **{lname: logits})
    check_tensor(indices, opname, iname)
    if logits.rank != 2:
        raise ValueError(f"{opname}: '{logits.id}' must be 2-D (samples, classes of this shard), "
                         f"got {logits.shape}")
    if indices.shape != logits.shape[:1]:
        raise ValueError(f"{opname}: '{indices.id}' must have shape {logits.shape[:1]} (one "
                         f"class index per row of '{logits.id}' {logits.shape}), got "
                         f"{indices.shape}")
    if not indices.dtype.is_int:
        raise TypeError(f"{opname}: '{indices.id}' must be an integer tensor, got "
                        f"{indices.dtype.name}")


def _ignore_tensor(opname: str, ignore_index: Union[None, int, Tensor],
                   indices: Tensor) -> Optional[Tensor]:
    if ignore_index is None:
        return None
    if isinstance(ignore_index, Tensor):
        if ignore_index.nelms != 1 or not ignore_index.dtype.is_int:
            raise ValueError(f"{opname}: 'ignore_index' must be an integer scalar, got "
                             f"'{ignore_index.id}' {ignore_index.shape} "
                             f"{ignore_index.dtype.name}")
        return ignore_index
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{opname}: 'ignore_index' must be None, an int or an integer scalar "
                        f"Tensor, got {ignore_index!r}")
    return constant(ignore_index, indices.dtype, "ignore_index")


def cross_entropy_sharded(logits: Tensor, indices: Tensor,
                          ignore_index: Union[None, int, Tensor] = None,
                          group: Optional[ReplicaGrouping] = None,
                          reduction: str = "mean") -> Tensor:
    """Softmax cross entropy of logits sharded over the classes of each replica group (op
    `CrossEntropySharded`; see `popxl_addons.ops.cross_entropy_sharded_loss`)."""
    opname = "cross_entropy_sharded_loss"
    _check_logits_indices(opname, logits, indices)
    if reduction not in CE_REDUCTIONS:
        raise ValueError(f"{opname}: reduction must be one of {CE_REDUCTIONS}, got "
                         f"{reduction!r}")
    stride, size = _group_attrs(opname, group)
    ignore = _ignore_tensor(opname, ignore_index, indices)
    n = logits.shape[0]
    ins = [logits, indices] + ([ignore] if ignore is not None else [])
    loss_shape = (n,) if reduction == "none" else ()
    attrs = {"stride": stride, "group_size": size, "reduction": reduction}
    loss, _ = add_op("CrossEntropySharded", "cross_entropy_sharded", ins,
                     [Out("loss", loss_shape, logits.dtype),
                      Out("logsumexp", (n,), dtypes.float32)], attrs)
    return loss


def cross_entropy_sharded_wr(logits: Sequence[Tensor], indices: Sequence[Tensor],
                             ipus: Optional[Sequence[int]] = None) -> List[Tensor]:
    """The within-replica version: class shards held by different IPUs of one replica (op
    `CrossEntropyShardedWR`). Returns one identical mean loss per IPU."""
    opname = "cross_entropy_sharded_wr_loss"
    for name, seq in (("logits", logits), ("indices", indices)):
        if isinstance(seq, Tensor) or not isinstance(seq, (list, tuple)) or not seq:
            raise TypeError(f"{opname}: '{name}' must be a non-empty list of Tensors (one per "
                            f"IPU), got {type(seq).__name__}")
    if len(logits) != len(indices):
        raise ValueError(f"{opname}: {len(logits)} logits but {len(indices)} indices")
    for i, (lg, ix) in enumerate(zip(logits, indices)):
        _check_logits_indices(opname, lg, ix, f"logits[{i}]", f"indices[{i}]")
        if lg.shape[0] != logits[0].shape[0] or lg.dtype != logits[0].dtype:
            raise ValueError(f"{opname}: every logits shard must have {logits[0].shape[0]} rows "
                             f"and dtype {logits[0].dtype.name}; '{lg.id}' is {lg.shape} "
                             f"{lg.dtype.name}")
    if ipus is None:
        ipus = [t.ipu for t in logits]
    ipus = [int(i) for i in ipus]
    if len(ipus) != len(logits) or len(set(ipus)) != len(ipus):
        raise ValueError(f"{opname}: need one distinct IPU per shard ({len(logits)}), got "
                         f"{ipus}")
    n, k = logits[0].shape[0], len(logits)
    outs = add_op("CrossEntropyShardedWR", "cross_entropy_sharded_wr",
                  list(logits) + list(indices),
                  [Out("loss", (), logits[0].dtype) for _ in range(k)]
                  + [Out("logsumexp", (n,), dtypes.float32) for _ in range(k)],
                  {"ipus": tuple(ipus)})
    for o, ipu in zip(outs, ipus + ipus):
        o._info.extra["ipu"] = ipu
    return outs[:k]


# --- distributed layer norm ------------------------------------------------------------------
def layer_norm_distributed(t: Tensor, w: Tensor, b: Tensor, epsilon: float = 1e-5,
                           group: Optional[ReplicaGrouping] = None) -> Tensor:
    """Layer norm over the last axis of `t`, whose hidden axis is sharded over the replicas of
    each group (op `LayerNormDistributed`)."""
    opname = "layer_norm_distributed"
    check_float_tensors(opname, _FLOATS, t=t, w=w, b=b)
    if t.rank < 1:
        raise ValueError(f"{opname}: '{t.id}' must have a hidden axis, got a scalar")
    h = t.shape[-1]
    for x in (w, b):
        if x.shape != (h,) or x.dtype != t.dtype:
            raise ValueError(f"{opname}: '{x.id}' must have shape ({h},) and dtype "
                             f"{t.dtype.name} (the local hidden shard of '{t.id}' {t.shape}), "
                             f"got {x.shape} {x.dtype.name}")
    if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or epsilon < 0:
        raise ValueError(f"{opname}: epsilon must be a non-negative number, got {epsilon!r}")
    stride, size = _group_attrs(opname, group)
    rows = math.prod(t.shape[:-1])
    y, _, _ = add_op("LayerNormDistributed", opname, [t, w, b],
                     [Out("layer_norm_distributed_out", t.shape, t.dtype, t.meta_shape),
                      Out("layer_norm_distributed_mean", (rows,), dtypes.float32),
                      Out("layer_norm_distributed_inv_std_dev", (rows,), dtypes.float32)],
                     {"stride": stride, "group_size": size, "epsilon": float(epsilon)})
    return y


# --- gradient norms ---------------------------------------------------------------------------
def grad_reduce_square_add(t: Tensor, loss_scaling: Union[float, Tensor]) -> Tensor:
    """float32 scalar `sum(t**2) / loss_scaling**2` (op `GradReduceSquareAdd`)."""
    opname = "grad_reduce_square_add"
    check_tensor(t, opname, "t")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{opname}: '{t.id}' must be a float tensor, got {t.dtype.name}")
    if isinstance(loss_scaling, Tensor):
        if loss_scaling.nelms != 1 or not loss_scaling.dtype.is_floating_point:
            raise ValueError(f"{opname}: 'loss_scaling' must be a float scalar, got "
                             f"'{loss_scaling.id}' {loss_scaling.shape} "
                             f"{loss_scaling.dtype.name}")
        ls = loss_scaling
    elif isinstance(loss_scaling, (int, float)) and not isinstance(loss_scaling, bool):
        if loss_scaling == 0:
            raise ValueError(f"{opname}: 'loss_scaling' must not be 0")
        ls = constant(float(loss_scaling), dtypes.float32, "loss_scaling")
    else:
        raise TypeError(f"{opname}: 'loss_scaling' must be a float or a scalar Tensor, got "
                        f"{loss_scaling!r}")
    return add_op("GradReduceSquareAdd", opname, [t, ls],
                  [Out(f"{t.name}_square_add", (), dtypes.float32)])[0]
