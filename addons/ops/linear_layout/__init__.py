"""Tile layout for matmuls (upstream custom op; numerically an identity)."""
from .linear_layout import linear_layout

__all__ = ["linear_layout"]
