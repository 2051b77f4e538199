"""The `Sum` op autodiff uses to add up several gradient contributions of one tensor (upstream's
grad-sum op; popxl has no public builder for it)."""
from __future__ import annotations

from typing import Sequence

from ..tensor import Tensor
from ._builder import Out, add_op, check_same_dtype

__all__ = ["grad_sum"]


def grad_sum(ts: Sequence[Tensor]) -> Tensor:
    """`ts[0] + ts[1] + ...` (same shapes and dtypes), added in that order."""
    ts = list(ts)
    if len(ts) < 2:
        raise ValueError(f"grad_sum: needs at least two tensors, got {len(ts)}")
    check_same_dtype("grad_sum", *ts)
    for t in ts[1:]:
        if t.shape != ts[0].shape:
            raise ValueError(f"grad_sum: shapes differ: '{ts[0].id}' {ts[0].shape} and "
                             f"'{t.id}' {t.shape}")
    return add_op("Sum", "sum", ts, [Out("sum_out", ts[0].shape, ts[0].dtype,
                                           ts[0].meta_shape)])[0]
