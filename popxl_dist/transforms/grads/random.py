"""Grad rules: dropout (the same mask, regenerated from the seed); the random number ops have
none."""
from __future__ import annotations

from typing import List, Optional

from ...ops._internal import grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("RandomUniform", "RandomNormal", "ModifyRandomSeed")


@grad_rule("Dropout", "ShapedDropout", "DropoutGrad")
def _dropout_grad(g, dys) -> Grads:
    # The same mask as the forward op: regenerated from the same seed.
    return [grad_op("DropoutGrad", [dys[0], g.fwd_in(1)], dys[0], dict(g.attrs)), None]
