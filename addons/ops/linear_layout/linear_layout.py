"""`linear_layout`: a tile re-layout, numerically an identity."""
from __future__ import annotations

import popxl
from popxl.ops._custom import linear_layout as _build

__all__ = ["linear_layout"]


def linear_layout(t: popxl.Tensor, bs: int = 1) -> popxl.Tensor:
    """`t` laid out linearly over the tiles in grains of `bs` (upstream: to feed a matmul
    without a rearrangement). Numerically an identity; its gradient is an identity.

    Args:
        t: any tensor.
        bs: the grain size (a positive int).
    """
    return _build(t, bs)
