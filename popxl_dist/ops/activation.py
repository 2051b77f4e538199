"""Builders: gelu(_) and softmax."""
from __future__ import annotations

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["gelu", "gelu_", "softmax"]


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
