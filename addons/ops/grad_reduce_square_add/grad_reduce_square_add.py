"""`grad_reduce_square_add`: one gradient's contribution to the squared global norm."""
from __future__ import annotations

from typing import Union

import popxl
from popxl.ops._tensor_parallel import grad_reduce_square_add as _build

__all__ = ["grad_reduce_square_add"]


def grad_reduce_square_add(t: popxl.Tensor, loss_scaling: Union[float, popxl.Tensor]
                           ) -> popxl.Tensor:
    """float32 scalar `sum(t**2) / loss_scaling**2`, computed in float32 (each element is
    divided by `loss_scaling` before squaring, so float16 gradients scaled by a large loss
    scaling do not overflow). It has no gradient.

    Args:
        t: a (loss-scaled) gradient, any float dtype and shape.
        loss_scaling: the loss scaling, a number or a float scalar Tensor.

    Example:
        >>> norm2 = ops.sum(ops.concat([grad_reduce_square_add(g, 1.0).reshape((1,))
        ...                             for g in grads]))
        >>> global_norm = ops.sqrt(norm2)
    """
    return _build(t, loss_scaling)
