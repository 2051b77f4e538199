"""Builders: `conv_transpose` (ONNX ConvTranspose) and the float8 convolutions
`conv_pow2scaled` / `conv_transpose_pow2scaled` (`conv` itself is in nn.py)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from .. import dtypes
from ..tensor import Tensor
from ._builder import Out, add_op
from .float8 import check_float8_operands, log2_scale_tensor
from .nn import _PAD_TYPES, _spatial_arg, check_float_operands, conv_geometry

__all__ = ["conv_pow2scaled", "conv_transpose", "conv_transpose_pow2scaled"]


def conv_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor,
                    stride: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0, 0, 0),
                    dilation: Sequence[int] = (1, 1), groups: int = 1,
                    pad_type: str = "not_set", available_memory_proportions=None,
                    enable_conv_dithering=None) -> Tensor:
    """`conv(t, weight) * 2^log2_scale` for float8 `t` and `weight`, as float16.

    The convolution of the decoded values accumulates in float32, is scaled and is rounded once
    to float16. Other arguments as `conv`.

    Args:
        t: float8 (N, C, *spatial).
        weight: float8 (M, C/groups, *kernel) (float8_143 and float8_152 may be mixed).
        log2_scale: an int32 scalar tensor (a Python int is accepted and made a constant).

    Returns:
        The float16 output (op type `Conv` with 3 inputs).
    """
    name = "conv_pow2scaled"
    check_float8_operands(name, "conv", t=t, weight=weight)
    s = log2_scale_tensor(name, log2_scale)
    attrs, shape = conv_geometry(name, t, weight, stride, padding, dilation, groups, pad_type)
    return add_op("Conv", name, [t, weight, s], [Out(f"{name}_out", shape, dtypes.float16)],
                  attrs)[0]


def _transpose_geometry(name: str, t: Tensor, weight: Tensor, stride, padding, dilation, groups,
                        pad_type: str, output_padding, output_shape) -> Tuple[dict, tuple]:
    """(ConvTranspose attrs, output shape) following ONNX ConvTranspose."""
    n = t.rank - 2
    if n < 1 or weight.rank != t.rank:
        raise ValueError(f"{name}: need 't' (N, C, *spatial) and 'weight' (C, M/groups, *kernel) "
                         f"of the same rank >= 3, got '{t.id}' {t.shape} and '{weight.id}' "
                         f"{weight.shape}")
    c = t.shape[1]
    if not isinstance(groups, int) or groups < 1 or c % groups:
        raise ValueError(f"{name}: groups {groups!r} must divide the input channels {c} of "
                         f"'{t.id}' {t.shape}")
    if weight.shape[0] != c:
        raise ValueError(f"{name}: 'weight' '{weight.id}' {weight.shape} needs dim 0 == the input "
                         f"channels {c} of 't' '{t.id}' {t.shape}")
    if pad_type not in _PAD_TYPES:
        raise ValueError(f"pad type {pad_type} is not valid, must be not_set, same_upper, "
                         f"same_lower or valid")
    stride = _spatial_arg(name, "stride", stride, n, 1)
    dilation = _spatial_arg(name, "dilation", dilation, n, 1)
    if min(stride + dilation) < 1:
        raise ValueError(f"{name}: stride {stride} and dilation {dilation} must be >= 1")
    out_pad = _spatial_arg(name, "output_padding", output_padding or None, n, 0)
    for p, s, d in zip(out_pad, stride, dilation):
        if not 0 <= p < max(s, d):
            raise ValueError(f"{name}: output_padding {out_pad} must be >= 0 and smaller than "
                             f"the stride {stride} or the dilation {dilation}")
    in_sp = t.shape[2:]
    eff = tuple((k - 1) * d + 1 for k, d in zip(weight.shape[2:], dilation))
    full = tuple(s * (i - 1) + p + e for s, i, p, e in zip(stride, in_sp, out_pad, eff))
    want: Optional[Tuple[int, ...]] = None
    if output_shape:
        want = tuple(int(v) for v in output_shape)
        if len(want) == n + 2:
            want = want[2:]
        if len(want) != n:
            raise ValueError(f"{name}: output_shape {tuple(output_shape)} must give the {n} "
                             f"spatial dims")
    elif pad_type in ("same_upper", "same_lower"):
        want = tuple(i * s for i, s in zip(in_sp, stride))
    if want is not None:
        total = [f - w for f, w in zip(full, want)]
        if min(total) < 0:
            raise ValueError(f"{name}: output shape {want} is larger than the full transposed "
                             f"convolution {full}")
        small = [tt // 2 for tt in total]
        if pad_type == "same_upper":
            pads = tuple(small) + tuple(tt - s for tt, s in zip(total, small))
        else:
            pads = tuple(tt - s for tt, s in zip(total, small)) + tuple(small)
    else:
        pads = (0,) * (2 * n) if pad_type == "valid" else _spatial_arg(
            name, "padding", padding, 2 * n, 0)
        if any(p < 0 for p in pads):
            raise ValueError(f"{name}: padding {pads} must be non-negative")
    out_sp = tuple(f - pads[d] - pads[n + d] for d, f in enumerate(full))
    if min(out_sp) < 1:
        raise ValueError(f"{name}: padding {pads} leaves no output (full size {full})")
    attrs = {"strides": stride, "pads": pads, "dilations": dilation, "group": groups,
             "output_padding": out_pad, "output_shape": out_sp}
    return attrs, (t.shape[0], weight.shape[1] * groups) + out_sp


def conv_transpose(t: Tensor, weight: Tensor, stride: Sequence[int] = (1, 1),
                   padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1),
                   groups: int = 1, pad_type: str = "not_set",
                   output_padding: Sequence[int] = (), output_shape: Sequence[int] = (),
                   available_memory_proportions=None, partials_types=None,
                   enable_conv_dithering=None) -> Tensor:
    """ONNX ConvTranspose: `t` (N, C, *in) with `weight` (C, M/groups, *kernel) gives
    (N, M, *out), out = stride*(in-1) + output_padding + (kernel-1)*dilation + 1 - pads.

    `padding` is (begins..., ends...). A given `output_shape` (spatial dims) sets the pads
    instead, as ONNX: total = full - output_shape, begins get total - total//2 ("same_upper":
    total//2); "same_upper"/"same_lower" without `output_shape` target in*stride. The
    memory/partials/dithering options only tune the IPU and are ignored.

    Deviation: upstream has no gradient for ConvTranspose; here autodiff differentiates it
    (d t = conv(dy, weight), d weight = the conv weight gradient with t and dy swapped).

    Returns:
        The output tensor (op type `ConvTranspose`).
    """
    name = "conv_transpose"
    check_float_operands(name, t, weight, "conv_transpose_pow2scaled")
    attrs, shape = _transpose_geometry(name, t, weight, stride, padding, dilation, groups,
                                       pad_type, output_padding, output_shape)
    return add_op("ConvTranspose", name, [t, weight], [Out(f"{name}_out", shape, t.dtype)],
                  attrs)[0]


def conv_transpose_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor,
                              stride: Sequence[int] = (1, 1),
                              padding: Sequence[int] = (0, 0, 0, 0),
                              dilation: Sequence[int] = (1, 1), groups: int = 1,
                              pad_type: str = "not_set", output_padding: Sequence[int] = (),
                              output_shape: Sequence[int] = (),
                              available_memory_proportions=None,
                              enable_conv_dithering=None) -> Tensor:
    """`conv_transpose(t, weight) * 2^log2_scale` for float8 operands, as float16 (computed in
    float32 from the decoded values, rounded once).

    Returns:
        The float16 output (op type `ConvTranspose` with 3 inputs).
    """
    name = "conv_transpose_pow2scaled"
    check_float8_operands(name, "conv", t=t, weight=weight)
    s = log2_scale_tensor(name, log2_scale)
    attrs, shape = _transpose_geometry(name, t, weight, stride, padding, dilation, groups,
                                       pad_type, output_padding, output_shape)
    return add_op("ConvTranspose", name, [t, weight, s],
                  [Out(f"{name}_out", shape, dtypes.float16)], attrs)[0]
