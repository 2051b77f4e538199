"""`rotary_pos_embed` (RoPE) and its sin/cos tables."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

import popxl
from popxl.ops._custom import rotary_pos_embed as _build

__all__ = ["rotary_pos_embed", "trig_table_constants", "trig_tables"]


def trig_tables(seq_len: int, rotary_dim: int, base: int = 10000,
                np_dtype: Any = "float32") -> Tuple[np.ndarray, np.ndarray]:
    """(sin, cos) tables `(seq_len, rotary_dim // 2)` of the angle `m * base**(-2i / rotary_dim)`
    of position m and pair i. As upstream, the arithmetic is done in `np_dtype` (so float16
    tables are computed in float16)."""
    inv_freq = base ** (-np.arange(0, rotary_dim, 2).astype(np_dtype) / rotary_dim)
    angles = np.outer(np.arange(seq_len).astype(np_dtype), inv_freq)
    return np.sin(angles), np.cos(angles)


def trig_table_constants(seq_len: int, rotary_dim: int, base: int = 10000,
                         dtype: popxl.dtype = popxl.float32
                         ) -> Tuple[popxl.Tensor, popxl.Tensor]:
    """`trig_tables` as popxl constants `(sin, cos)` of `dtype` in the current graph."""
    sin, cos = trig_tables(seq_len, rotary_dim, base, dtype.as_numpy())
    return popxl.constant(sin, dtype), popxl.constant(cos, dtype)


def rotary_pos_embed(t: popxl.Tensor, sin: popxl.Tensor, cos: popxl.Tensor,
                     rotary_dim: Optional[int] = None) -> popxl.Tensor:
    """Rotary positional embedding (RoPE) of queries or keys `t` `(batch, seq, heads, head_dim)`.

    The first `rotary_dim` features of each head are read as `rotary_dim // 2` complex numbers
    with interleaved parts, `(t[..., 2i], t[..., 2i + 1])` = (real, imaginary), and each is
    turned by the angle of its position: `(re cos - im sin, im cos + re sin)`. The remaining
    features pass through. The gradient is the inverse rotation (op `RotaryPosEmbedGrad`).

    Args:
        t: float32/float16 tensor of rank 4, `(batch, seq, heads, head_dim)`.
        sin, cos: tables of `t`'s dtype, `(seq, rotary_dim // 2)` (made `(1, seq, ...)`) or
            `(1 or batch, seq, rotary_dim // 2)` (`trig_table_constants`).
        rotary_dim: number of rotated features; falsy (the default) rotates all of `head_dim`.

    Example:
        >>> sin, cos = trig_table_constants(seq_len, rotary_dim)
        >>> q = rotary_pos_embed(q, sin, cos, rotary_dim)
    """
    for name, x in (("t", t), ("sin", sin), ("cos", cos)):
        if not isinstance(x, popxl.Tensor):
            raise TypeError(f"rotary_pos_embed: '{name}' must be a popxl.Tensor, got "
                            f"{type(x).__name__}")
    if t.rank != 4:
        raise ValueError(f"rotary_pos_embed: '{t.id}' must have rank 4 (batch, seq, heads, "
                         f"head_dim), got {t.shape}")
    if not rotary_dim:
        rotary_dim = t.shape[-1]
    if sin.rank == 2:
        sin = sin.reshape((1, *sin.shape))
    if cos.rank == 2:
        cos = cos.reshape((1, *cos.shape))
    return _build(t, sin, cos, rotary_dim)
