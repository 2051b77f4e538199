"""Builders: normalisations (group_norm, layer_norm, batch_norm_inference), nll_loss and the
fused nll_loss_with_softmax_grad."""
from __future__ import annotations

from typing import Literal, Optional, Tuple, Union

from popart import ReductionType

from .. import dtypes
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_same_dtype, check_tensor

__all__ = ["group_norm", "layer_norm", "batch_norm_inference", "nll_loss",
           "nll_loss_with_softmax_grad"]


def _group_norm(opname: str, t: Tensor, weight: Tensor, bias: Tensor, num_groups: int,
                eps: float) -> Tensor:
    check_tensor(t, opname, "t")
    check_tensor(weight, opname, "weight")
    check_tensor(bias, opname, "bias")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{opname}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    check_same_dtype(opname, t, weight, bias)
    if t.rank < 2:
        raise ValueError(f"{opname}: 't' '{t.id}' must have shape (N, C, ...), got {t.shape}")
    c = t.shape[1]
    for arg, p in (("weight", weight), ("bias", bias)):
        if p.shape != (c,):
            raise ValueError(f"{opname}: '{arg}' '{p.id}' must have shape ({c},) (the channel "
                             f"dim 1 of 't' {t.shape}), got {p.shape}")
    if not isinstance(num_groups, int) or num_groups < 1 or c % num_groups:
        raise ValueError(f"{opname}: num_groups {num_groups!r} must be a positive divisor of the "
                         f"channel count {c} of 't' '{t.id}' {t.shape}")
    n_stats = t.shape[0] * num_groups
    return add_op("GroupNormalization", opname, [t, weight, bias],
                  [Out(f"{opname}_out", t.shape, t.dtype, t.meta_shape),
                   Out(f"{opname}_mean", (n_stats,), t.dtype),
                   Out(f"{opname}_inv_std_dev", (n_stats,), t.dtype)],
                  {"num_groups": num_groups, "epsilon": float(eps)})[0]


def group_norm(t: Tensor, weight: Tensor, bias: Tensor, num_groups: int,
               eps: float = 1e-5) -> Tensor:
    """Group normalisation of `t` (N, C, *spatial) with per-channel `weight` and `bias` (C,).

    Each sample's channels are split into `num_groups` groups, normalised over the group's
    channels and all spatial positions with the biased variance: y = (x-mean)/sqrt(var+eps).
    """
    return _group_norm("group_norm", t, weight, bias, num_groups, eps)


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """`group_norm` with one group: normalises all non-batch dims together; weight and bias have
    shape (t.shape[1],). For last-dim layer norm, reshape `t` to 2-D first."""
    return _group_norm("layer_norm", t, weight, bias, 1, eps)


def batch_norm_inference(t: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                         epsilon: float = 1e-5, momentum: float = 0.9) -> Tensor:
    """y = scale*(x-mean)/sqrt(var+eps) + bias over channel axis 1 (running statistics given).

    `momentum` is accepted for API compatibility; inference does not update statistics.
    """
    name = "batch_norm_inference"
    check_tensor(t, name, "t")
    params = (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))
    for arg, p in params:
        check_tensor(p, name, arg)
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    check_same_dtype(name, t, *(p for _, p in params))
    if t.rank < 2:
        raise ValueError(f"{name}: 't' '{t.id}' must have shape (N, C, ...), got {t.shape}")
    c = t.shape[1]
    for arg, p in params:
        if p.shape != (c,):
            raise ValueError(f"{name}: '{arg}' '{p.id}' must have shape ({c},) (the channel dim "
                             f"1 of 't' {t.shape}), got {p.shape}")
    return add_op("BatchNormalization", name, [t, scale, bias, mean, var],
                  [Out(f"{name}_out", t.shape, t.dtype, t.meta_shape)],
                  {"epsilon": float(epsilon), "momentum": float(momentum)})[0]


REDUCTION_TYPE = Literal["mean", "sum", "none"]
REDUCTION_MAP = {"mean": ReductionType.Mean, "sum": ReductionType.Sum,
                 "none": ReductionType.NoReduction}
_REDUCTIONS = tuple(REDUCTION_MAP)


def nll_loss(probs: Tensor, labels: Tensor, ignore_index: Optional[int] = None,
             reduction: str = "mean", log_prob: bool = False) -> Tensor:
    """Negative log likelihood of `probs` (..., C) at integer `labels` (...).

    Per sample: -log(max(p[label], eps)) (eps 1e-7 for float32, 6.104e-5 for float16), or
    -p[label] when `log_prob`. "mean" divides by the count of non-ignored samples (at least 1);
    samples whose label is `ignore_index` contribute 0.

    Returns:
        `loss`: a scalar, or shaped like `labels` for reduction "none".
    """
    name = "nll_loss"
    check_tensor(probs, name, "probs")
    check_tensor(labels, name, "labels")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Not a valid reduction: {reduction}. Must choose from: "
                         f"{', '.join(_REDUCTIONS)}")
    if not probs.dtype.is_floating_point:
        raise TypeError(f"{name}: probs '{probs.id}' must be floating point, got "
                        f"{probs.dtype.name}")
    if not labels.dtype.is_int:
        raise TypeError(f"{name}: labels '{labels.id}' must be integer class ids, got "
                        f"{labels.dtype.name}")
    if probs.rank < 1 or labels.nelms * probs.shape[-1] != probs.nelms:
        raise ValueError(f"{name}: probs '{probs.id}' {probs.shape} and labels '{labels.id}' "
                         f"{labels.shape} do not match: need probs (..., C) with one label per "
                         f"row")
    loss_shape = labels.shape if reduction == "none" else ()
    return add_op("Nll", name, [probs, labels], [Out("loss", loss_shape, probs.dtype)],
                  {"ignore_index": None if ignore_index is None else int(ignore_index),
                   "reduction": reduction, "log_prob": bool(log_prob)})[0]


def nll_loss_with_softmax_grad(probs: Tensor, labels: Tensor,
                               loss_grad: Union[float, Tensor] = 1,
                               ignore_index: Optional[int] = None,
                               reduction: str = "mean") -> Tuple[Tensor, Tensor]:
    """Fused NLL loss of softmax `probs` and its gradient w.r.t. the pre-softmax logits.

    Returns (loss, dx) with dx = (probs - onehot(labels)) * loss_grad (/ count for "mean").
    """
    check_tensor(probs, "nll_loss_with_softmax_grad", "probs")
    check_tensor(labels, "nll_loss_with_softmax_grad", "labels")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"Not a valid reduction: {reduction}. Must choose from: mean, sum, "
                         f"none")
    if probs.rank < 1 or labels.nelms * probs.shape[-1] != probs.nelms:
        raise ValueError(f"nll_loss_with_softmax_grad: probs '{probs.id}' {probs.shape} and "
                         f"labels '{labels.id}' {labels.shape} do not match: need probs "
                         f"(..., C) with one label per row")
    if not isinstance(loss_grad, Tensor):
        loss_grad = constant(float(loss_grad), dtypes.float32, "loss_grad")
    loss_shape = () if reduction != "none" else labels.shape
    return tuple(add_op("NlllWithSoftmaxGradDirect", "nll_loss_with_softmax_grad",
                        [probs, labels, loss_grad],
                        [Out("loss", loss_shape, probs.dtype), Out("dx", probs.shape, probs.dtype)],
                        {"ignore_index": ignore_index, "reduction": reduction}))
