"""Dense x constant-sparse matmul (upstream custom op)."""
from .dense_sparse_matmul import CSRMatrix, dense_const_sparse_matmul, random_sparse

__all__ = ["dense_const_sparse_matmul", "random_sparse", "CSRMatrix"]
