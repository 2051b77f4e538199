"""`dense_const_sparse_matmul`: a dense tensor times a constant sparse (CSR) matrix.

Upstream takes a `scipy.sparse.csr_matrix`; scipy is not a dependency here, so any object with
CSR `data`, `indices`, `indptr` and `shape` is accepted (a scipy matrix works), and
`random_sparse` returns our own small `CSRMatrix`.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

import popxl
from popxl.ops._custom import csr_arrays
from popxl.ops._custom import dense_const_sparse_matmul as _build

__all__ = ["CSRMatrix", "dense_const_sparse_matmul", "random_sparse"]


class CSRMatrix:
    """A compressed-sparse-row matrix: row r holds `data[indptr[r]:indptr[r+1]]` at columns
    `indices[indptr[r]:indptr[r+1]]`."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                 shape: Tuple[int, int]):
        self.data = np.asarray(data)
        self.indices = np.asarray(indices, np.int32)
        self.indptr = np.asarray(indptr, np.int32)
        self.shape = (int(shape[0]), int(shape[1]))
        csr_arrays(self)        # validates

    @classmethod
    def from_dense(cls, dense: np.ndarray) -> "CSRMatrix":
        """The non-zero entries of a 2-D array, row by row."""
        dense = np.asarray(dense)
        if dense.ndim != 2:
            raise ValueError(f"CSRMatrix.from_dense: expected a 2-D array, got shape "
                             f"{dense.shape}")
        rows, cols = np.nonzero(dense)
        indptr = np.zeros(dense.shape[0] + 1, np.int32)
        np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
        return cls(dense[rows, cols], cols, indptr, dense.shape)

    @property
    def nnz(self) -> int:
        return int(self.data.size)

    def toarray(self) -> np.ndarray:
        out = np.zeros(self.shape, self.data.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out

    def __repr__(self) -> str:
        return f"CSRMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.data.dtype})"


def random_sparse(dense: np.ndarray, density: float = 0.5) -> CSRMatrix:
    """`dense` with each entry kept with probability `density` (else zero), as a CSR matrix.
    Draws from the global NumPy RNG."""
    if not 0 <= density <= 1:
        raise ValueError(f"random_sparse: density must be in [0, 1], got {density!r}")
    dense = np.asarray(dense)
    keep = np.random.random_sample(dense.shape) < density
    return CSRMatrix.from_dense(np.where(keep, dense, np.zeros((), dense.dtype)))


def dense_const_sparse_matmul(lhs: popxl.Tensor, rhs, output_cols: int) -> popxl.Tensor:
    """`lhs @ rhs` for a dense `lhs` `(..., K)` and a constant sparse `rhs` `(K, N)`.

    Args:
        lhs: float32/float16 tensor.
        rhs: a CSR matrix (`CSRMatrix`, scipy's `csr_matrix`, or any object with `data`,
            `indices`, `indptr`, `shape`); its values are cast to lhs's dtype.
        output_cols: N, the number of columns of the result (checked against `rhs.shape[1]`).

    Returns:
        `(..., N)` in lhs's dtype (float16 accumulates in float32). The gradient of `lhs` is
        `dy @ rhs.T`; the constant matrix has none.
    """
    return _build(lhs, rhs, output_cols)
