"""4-bit group quantisation (FlexGen): host compression and on-device decompression.

Along axis `dim`, values are cut into groups of `group_size`; each group keeps a float16 `scale`
= (max - min) / 15 and `bias` = min, and each value a 4-bit code `round((x - bias) / scale)`.
Four codes are packed per uint16, the first in the highest nibble (as upstream). Layouts,
with `*lead` the other axes and G = size(dim) / group_size:

    compressed (*lead, G, group_size // 4) uint16     scale, bias (*lead, G, 1) float16

Decompression is `code * scale + bias`, in float32, rounded to the scale's dtype.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

import popxl
from popxl.ops._custom import group_quantize_decompress as _build

__all__ = ["group_quantize_compress_numpy", "group_quantize_decompress",
           "group_quantize_decompress_numpy"]


def group_quantize_compress_numpy(t: np.ndarray, group_size: int, dim: int
                                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compress a float array to 4-bit codes per group of `group_size` along `dim`.

    Returns:
        `(compressed uint16, scale float16, bias float16)` in the layouts of the module doc.
    """
    t = np.asarray(t)
    if t.ndim < 1 or not -t.ndim <= dim < t.ndim:
        raise ValueError(f"group_quantize_compress_numpy: dim {dim!r} is out of range for "
                         f"shape {t.shape}")
    if not np.isfinite(t).all():
        raise ValueError("Cannot compress t which contains non-finite values")
    x = np.moveaxis(t.astype(np.float32), dim, -1)
    n = x.shape[-1]
    if not isinstance(group_size, int) or group_size < 4 or group_size % 4 or n % group_size:
        raise ValueError(f"group_quantize_compress_numpy: group_size must be a multiple of 4 "
                         f"dividing the size {n} of axis {dim}, got {group_size!r}")
    g = x.reshape(x.shape[:-1] + (n // group_size, group_size))
    lo, hi = g.min(axis=-1, keepdims=True), g.max(axis=-1, keepdims=True)
    scale = ((hi - lo) / 15).astype(np.float16)
    bias = lo.astype(np.float16)
    s32 = scale.astype(np.float32)
    codes = np.where(s32 > 0, np.rint((g - bias.astype(np.float32)) / np.where(s32 > 0, s32, 1)),
                     0)
    codes = np.clip(codes, 0, 15).astype(np.uint16)
    quads = codes.reshape(codes.shape[:-1] + (group_size // 4, 4))
    # as upstream: the first code of each group of 4 in the highest nibble
    packed = (quads[..., 0] << 12 | quads[..., 1] << 8 | quads[..., 2] << 4 | quads[..., 3])
    return packed.astype(np.uint16), scale, bias


def group_quantize_decompress_numpy(t: np.ndarray, group_scale: np.ndarray,
                                    group_bias: np.ndarray, dim: int) -> np.ndarray:
    """The host twin of `group_quantize_decompress`."""
    t = np.asarray(t, np.uint16)
    codes = (t[..., None] >> np.array([12, 8, 4, 0], np.uint16)) & 0xF
    v = codes.reshape(t.shape[:-1] + (-1,)).astype(np.float32) \
        * group_scale.astype(np.float32) + group_bias.astype(np.float32)
    v = v.reshape(t.shape[:-2] + (-1,)).astype(group_scale.dtype)
    return np.moveaxis(v, -1, dim)


def group_quantize_decompress(t: popxl.Tensor, group_scale: popxl.Tensor,
                              group_bias: popxl.Tensor, dim: int = -1) -> popxl.Tensor:
    """Decompress group-quantised weights on the device (no gradient).

    Args:
        t: uint16 codes `(*lead, G, group_size // 4)`.
        group_scale, group_bias: `(*lead, G, 1)` float16 (or float32).
        dim: where the grouped axis goes in the output.

    Returns:
        `(..., G * group_size, ...)` of the scale's dtype.

    Example:
        >>> packed, scale, bias = group_quantize_compress_numpy(w, 64, -1)
        >>> w_t = group_quantize_decompress(packed_t, scale_t, bias_t, dim=-1)
    """
    return _build(t, group_scale, group_bias, dim)
