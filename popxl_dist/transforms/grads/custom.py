"""Grad rules: the single-replica custom ops (see `ops/_custom.py`).

RoPE differentiates to the inverse rotation, the linear layout to an identity and the dense x
constant-sparse matmul to a matmul with the transposed sparse matrix; the decompression of
quantised (integer) weights has no gradient.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import List, Optional

import numpy as np

from ...ops._custom import dense_const_sparse_matmul, rotary_pos_embed
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

__all__: list = []   # registrations only

Grads = List[Optional[Tensor]]

no_grad("GroupQuantizeDecompress")


@grad_rule("RotaryPosEmbed")
def _rotary_grad(g, dys) -> Grads:
    return [rotary_pos_embed(dys[0], g.fwd_in(1), g.fwd_in(2), g.attrs["rotary_dim"],
                             op_type="RotaryPosEmbedGrad"), None, None]


@grad_rule("LinearLayout")
def _linear_layout_grad(g, dys) -> Grads:
    return [dys[0]]


def _transposed_csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, rows: int,
                    cols: int) -> SimpleNamespace:
    """The CSR arrays of the transpose (a stable sort of the entries by column)."""
    row_of = np.repeat(np.arange(rows, dtype=np.int32), np.diff(indptr))
    order = np.argsort(indices, kind="stable")
    t_indptr = np.zeros(cols + 1, np.int32)
    np.cumsum(np.bincount(indices, minlength=cols), out=t_indptr[1:])
    return SimpleNamespace(data=data[order], indices=row_of[order], indptr=t_indptr,
                           shape=(cols, rows))


@grad_rule("DenseConstSparseMatMul")
def _dense_sparse_matmul_grad(g, dys) -> Grads:
    rows, cols = g.attrs["rows"], g.attrs["cols"]
    data, indices, indptr = (g.in_info(i).data for i in (1, 2, 3))
    rhs_t = _transposed_csr(data, indices, indptr, rows, cols)
    return [dense_const_sparse_matmul(dys[0], rhs_t, rows), None, None, None]
