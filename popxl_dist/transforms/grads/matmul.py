"""Grad rule: MatMul (batch broadcasting as np.matmul; the float8 form in float8.py)."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...tensor import Tensor
from ..grad_registry import grad_rule
from ._common import matmul_operand_grads
from .float8 import matmul_pow2scaled_grad

__all__: List[str] = []   # registrations only

Grads = List[Optional[Tensor]]


@grad_rule("MatMul")
def _matmul_grad(g, dys) -> Grads:
    dy, = dys
    if g.num_inputs == 3:                     # matmul_pow2scaled: see grads/float8.py
        return matmul_pow2scaled_grad(g, dy)
    a_dtype = g.in_info(0).dtype
    if dy.dtype != a_dtype:
        dy = ops.cast(dy, a_dtype)
    return matmul_operand_grads(g, dy, lambda: g.fwd_in(0), lambda: g.fwd_in(1))
