"""`rotary_pos_embed` (RoPE) and its sin/cos tables."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

import popxl
from popxl.ops._custom import rotary_pos_embed as _build

__all__ = ["rotary_pos_embed", "trig_table_constants", "trig_tables"]


def trig_tables(seq_len: int, rotary_dim: int, base: int = 10000,
                np_dtype: str = "float32") -> Tuple[np.ndarray, np.ndarray]:
    """(sin, cos) tables `(seq_len, rotary_dim // 2)`: angle `p / base**(2i / rotary_dim)` for
    position p and frequency i, computed in float64 and cast to `np_dtype`."""
    if not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"trig_tables: rotary_dim must be a positive even int, got "
                         f"{rotary_dim!r}")
    inv_freq = 1.0 / (base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    angles = np.outer(np.arange(seq_len, dtype=np.float64), inv_freq)
    return np.sin(angles).astype(np_dtype), np.cos(angles).astype(np_dtype)


def trig_table_constants(seq_len: int, rotary_dim: int, base: int = 10000,
                         dtype: popxl.dtype = popxl.float32
                         ) -> Tuple[popxl.Tensor, popxl.Tensor]:
    """`trig_tables` as popxl constants `(sin, cos)` of `dtype` in the current graph."""
    sin, cos = trig_tables(seq_len, rotary_dim, base, dtype.as_numpy())
    return popxl.constant(sin, dtype, "sin"), popxl.constant(cos, dtype, "cos")


def rotary_pos_embed(t: popxl.Tensor, sin: popxl.Tensor, cos: popxl.Tensor,
                     rotary_dim: Optional[int] = None) -> popxl.Tensor:
    """Rotary positional embedding of `t` `(..., seq, head_dim)` (e.g. `(batch, heads, seq,
    head_dim)`).

    The first `rotary_dim` features are split into halves x1 = `[:rotary_dim/2]` and x2 =
    `[rotary_dim/2:rotary_dim]` (the "rotate half" layout of GPT-NeoX and Llama) and rotated by
    the angle of each position: `(x1 cos - x2 sin, x2 cos + x1 sin)`; the remaining features pass
    through. The gradient is the inverse rotation.

    Args:
        t: float32/float16 queries or keys.
        sin, cos: `(seq, rotary_dim // 2)` tables (`trig_table_constants`).
        rotary_dim: number of rotated features (default `2 * sin.shape[1]`).

    Example:
        >>> sin, cos = trig_table_constants(seq_len, rotary_dim)
        >>> q = rotary_pos_embed(q, sin, cos, rotary_dim)
    """
    return _build(t, sin, cos, rotary_dim)
