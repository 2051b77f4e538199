"""Builders: gelu(_), softmax and the fused nll_loss_with_softmax_grad."""
from __future__ import annotations

from typing import Optional, Tuple, Union

from .. import dtypes
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_tensor

__all__ = ["gelu", "gelu_", "softmax", "nll_loss_with_softmax_grad"]


def gelu(t: Tensor) -> Tensor:
    """GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))."""
    check_tensor(t, "gelu", "t")
    return add_op("Gelu", "gelu", [t], [Out("gelu_out", t.shape, t.dtype, t.meta_shape)])[0]


def gelu_(t: Tensor) -> Tensor:
    """In-place GELU (tanh approximation)."""
    check_tensor(t, "gelu_", "t")
    return add_op("GeluInplace", "gelu_inplace", [t],
                  [Out("gelu_inplace_out", t.shape, t.dtype, t.meta_shape)])[0]


def softmax(t: Tensor, axis: int) -> Tensor:
    """Softmax along `axis` (negative allowed)."""
    check_tensor(t, "softmax", "t")
    if not -t.rank <= axis < t.rank:
        raise ValueError(f"softmax: axis {axis} out of range for '{t.id}' {t.shape}")
    return add_op("Softmax", "softmax", [t], [Out("softmax_out", t.shape, t.dtype)],
                  {"axis": axis % t.rank})[0]


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
    if not labels.dtype.is_int:
        raise TypeError(f"nll_loss_with_softmax_grad: labels '{labels.id}' must be integer class "
                        f"ids, got {labels.dtype.name}")
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
