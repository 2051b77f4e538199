"""Softmax cross-entropy: `cross_entropy` and the fused `cross_entropy_with_grad`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import popxl
from popxl import ops

__all__ = ["cross_entropy", "cross_entropy_with_grad"]


def cross_entropy(x: popxl.Tensor, labels: popxl.Tensor, ignore_index: Optional[int] = None,
                  reduction: str = "mean") -> popxl.Tensor:
    """`nll_loss(softmax(x, -1), labels)`; x is `(*dims, C)`, labels `(*dims)`.

    Note that the third positional argument is `ignore_index` (unlike `cross_entropy_with_grad`).
    """
    return ops.nll_loss(ops.softmax(x, -1), labels, ignore_index=ignore_index,
                        reduction=reduction)


def cross_entropy_with_grad(x: popxl.Tensor, labels: popxl.Tensor,
                            loss_scaling: Union[float, popxl.Tensor] = 1,
                            ignore_index: Optional[int] = None,
                            reduction: str = "mean") -> Tuple[popxl.Tensor, popxl.Tensor]:
    """Softmax cross-entropy loss and its gradient with respect to the logits `x`.

    The loss is not scaled; `dx = (softmax(x) - onehot(labels)) * loss_scaling`, divided by the
    number of non-ignored labels (at least 1) for "mean". Rows labelled `ignore_index` give 0.

    Returns:
        (loss, dx)
    """
    if not isinstance(loss_scaling, popxl.Tensor):
        loss_scaling = popxl.constant(loss_scaling, popxl.float32)
    probs = ops.softmax(x, -1)
    return ops.nll_loss_with_softmax_grad(probs, labels, loss_grad=loss_scaling,
                                          ignore_index=ignore_index, reduction=reduction)
