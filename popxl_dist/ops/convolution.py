"""Builders: conv, conv_transpose (ONNX ConvTranspose), their float8 forms conv_pow2scaled /
conv_transpose_pow2scaled, and pooling (average_pool, max_pool): windowed sweeps over the
spatial dims."""
from __future__ import annotations

from typing import Any, Dict, Literal, NamedTuple, Optional, Sequence, Tuple

from .. import dtypes
from ..context import gcg
from ..tensor import Tensor
from ._builder import Out, add_op, check_same_dtype, check_tensor
from .float8 import check_float8_operands, log2_scale_tensor

__all__ = ["conv", "conv_pow2scaled", "conv_transpose", "conv_transpose_pow2scaled",
           "average_pool", "max_pool", "PadType"]


PadType = Literal["not_set", "same_upper", "same_lower", "valid"]
_PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")
_PARTIALS_TYPES = ("float", "half")


def multi_conv_options(sess_opts, attr_param: Optional[Dict[str, Any]],
                       available_memory_proportions, partials_types,
                       enable_conv_dithering) -> Dict[str, Any]:
    """The per-convolution tuning options of a conv op, checked: the session's
    `convolutionOptions` with `attr_param` on top, plus the memory proportions (in (0, 1]),
    partials types ("float"/"half") and dithering flags. They tune Poplar's convolution
    planner only; the emulator computes the same result whatever they are."""
    def as_list(v):
        return [] if v is None else list(v) if isinstance(v, (list, tuple)) else [v]

    amps = [float(a) for a in as_list(available_memory_proportions)]
    if any(not 0.0 < a <= 1.0 for a in amps):
        raise ValueError(f"conv: available_memory_proportions must be in (0, 1], got {amps}")
    partials = [str(p).lower() for p in as_list(partials_types)]
    if any(p not in _PARTIALS_TYPES for p in partials):
        raise ValueError(f"conv: partials_types must be 'float' or 'half', got {partials}")
    options = dict(getattr(sess_opts, "convolutionOptions", {}) or {})
    options.update(attr_param or {})
    return {"convolutionOptions": options, "availableMemoryProportions": amps,
            "partialsTypes": partials,
            "enableConvDithering": [bool(d) for d in as_list(enable_conv_dithering)]}


class ReceptiveAttributes(NamedTuple):
    """Window attributes of a pooling or convolution op (upstream's ReceptiveOpAttributes)."""

    strides: Tuple[int, ...]
    pads: Tuple[int, ...]
    outPads: Tuple[int, ...]
    dilations: Tuple[int, ...]
    inDilations: Tuple[int, ...]
    auto_pad: str
    ceil_mode: int


def receptive_attributes(strides, pads, out_pads, dilations, in_dilations, auto_pad,
                         ceil_mode) -> ReceptiveAttributes:
    """The window attributes as PopART takes them: None becomes an empty list (the op's
    default), `ceil_mode` an int."""
    def t(v):
        return () if v is None else tuple(int(x) for x in v)

    return ReceptiveAttributes(t(strides), t(pads), t(out_pads), t(dilations), t(in_dilations),
                               str(auto_pad), int(bool(ceil_mode)))


def _spatial_arg(opname: str, argname: str, v, n: int, default: int) -> Tuple[int, ...]:
    if v is None:
        return (default,) * n
    v = tuple(int(a) for a in ([v] if isinstance(v, int) else v))
    if len(v) != n and v and all(a == default for a in v):
        return (default,) * n           # the 2-D defaults also serve 1-D and 3-D inputs
    if len(v) != n:
        raise ValueError(f"{opname}: '{argname}' must have {n} entries (one per spatial dim), "
                         f"got {v}")
    return v


def _resolve_pads(opname: str, in_sp, eff_k, stride, padding, pad_type: str,
                  ceil_mode: bool = False) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(pads (begins..., ends...), output spatial shape) following ONNX."""
    n = len(in_sp)
    if pad_type not in _PAD_TYPES:
        raise ValueError(f"pad type {pad_type} is not valid, must be not_set, same_upper, "
                         f"same_lower or valid")
    if pad_type in ("same_upper", "same_lower"):
        out = tuple(-(-i // s) for i, s in zip(in_sp, stride))
        begins, ends = [], []
        for i, k, s, o in zip(in_sp, eff_k, stride, out):
            total = max((o - 1) * s + k - i, 0)
            small = total // 2
            b = small if pad_type == "same_upper" else total - small
            begins.append(b)
            ends.append(total - b)
        return tuple(begins + ends), out
    pads = (0,) * (2 * n) if pad_type == "valid" else _spatial_arg(
        opname, "padding", padding, 2 * n, 0)
    if any(p < 0 for p in pads):
        raise ValueError(f"{opname}: padding {pads} must be non-negative")
    out = []
    for d in range(n):
        span = in_sp[d] + pads[d] + pads[n + d] - eff_k[d]
        if span < 0:
            raise ValueError(f"{opname}: the (dilated) kernel {eff_k} is larger than the padded "
                             f"input {in_sp} with pads {pads}")
        o = (-(-span // stride[d]) if ceil_mode else span // stride[d]) + 1
        out.append(o)
    return pads, tuple(out)


def check_float_operands(name: str, t: Tensor, weight: Tensor, float8_op: str) -> None:
    """`t` and `weight` are tensors of one (non-float8) floating point dtype."""
    check_tensor(t, name, "t")
    check_tensor(weight, name, "weight")
    check_same_dtype(name, t, weight)
    if not t.dtype.is_floating_point or t.dtype in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"{name}: 't' '{t.id}' must be floating point (float8: use "
                        f"{float8_op}), got {t.dtype.name}")


def conv_geometry(name: str, t: Tensor, weight: Tensor, stride, padding, dilation, groups,
                  pad_type: str) -> Tuple[dict, Tuple[int, ...]]:
    """(Conv attrs, output shape) of `t` (N, C, *spatial) with `weight` (M, C/groups, *k)."""
    n = t.rank - 2
    if n < 1 or weight.rank != t.rank:
        raise ValueError(f"{name}: need 't' (N, C, *spatial) and 'weight' (M, C/groups, *kernel) "
                         f"of the same rank >= 3, got '{t.id}' {t.shape} and '{weight.id}' "
                         f"{weight.shape}")
    if not isinstance(groups, int) or groups < 1 or t.shape[1] % groups or \
            weight.shape[0] % groups:
        raise ValueError(f"{name}: groups {groups!r} must divide the input channels "
                         f"{t.shape[1]} and the output channels {weight.shape[0]}")
    if weight.shape[1] * groups != t.shape[1]:
        raise ValueError(f"{name}: 'weight' '{weight.id}' {weight.shape} needs dim 1 == C/groups "
                         f"= {t.shape[1] // groups} for 't' '{t.id}' {t.shape}")
    stride = _spatial_arg(name, "stride", stride, n, 1)
    dilation = _spatial_arg(name, "dilation", dilation, n, 1)
    if min(stride + dilation) < 1:
        raise ValueError(f"{name}: stride {stride} and dilation {dilation} must be >= 1")
    kernel = weight.shape[2:]
    eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation))
    pads, out_sp = _resolve_pads(name, t.shape[2:], eff, stride, padding, pad_type)
    attrs = {"strides": stride, "pads": pads, "dilations": dilation, "group": groups}
    return attrs, (t.shape[0], weight.shape[0]) + out_sp


def conv(t: Tensor, weight: Tensor, stride: Sequence[int] = (1, 1),
         padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1), groups: int = 1,
         pad_type: PadType = "not_set", available_memory_proportions=None,
         partials_types=None, enable_conv_dithering=None) -> Tensor:
    """ONNX Conv: `t` (N, C, *spatial) with `weight` (M, C/groups, *kernel), no bias.

    `padding` is ONNX-style (begins..., ends...); `pad_type` "same_upper"/"same_lower"/"valid"
    overrides it. The memory/partials/dithering options only tune the IPU: they are checked
    (`multi_conv_options`) and do not change the result. float8 operands need
    `conv_pow2scaled`.
    """
    name = "conv"
    check_float_operands(name, t, weight, "conv_pow2scaled")
    multi_conv_options(gcg().ir._session_opts(), None, available_memory_proportions,
                       partials_types, enable_conv_dithering)
    attrs, shape = conv_geometry(name, t, weight, stride, padding, dilation, groups, pad_type)
    return add_op("Conv", name, [t, weight], [Out(f"{name}_out", shape, t.dtype)], attrs)[0]


def _pool(op_type: str, name: str, t: Tensor, kernel_size, stride, padding, out_pads, dilation,
          in_dilations, auto_pad: str, ceil_mode: bool, extra) -> Tensor:
    check_tensor(t, name, "t")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    n = t.rank - 2
    if n < 1:
        raise ValueError(f"{name}: 't' '{t.id}' must be (N, C, *spatial), got {t.shape}")
    kernel = _spatial_arg(name, "kernel_size", kernel_size, n, 1)
    stride = _spatial_arg(name, "stride", stride, n, 1)
    dilation = _spatial_arg(name, "dilation", dilation, n, 1)
    in_dil = _spatial_arg(name, "in_dilations", in_dilations, n, 1)
    out_pads = _spatial_arg(name, "out_pads", out_pads, 2 * n, 0)
    if min(in_dil) < 1 or min(out_pads) < 0:
        raise ValueError(f"{name}: in_dilations {in_dil} must be >= 1 and out_pads {out_pads} "
                         f">= 0")
    if min(kernel + stride + dilation) < 1:
        raise ValueError(f"{name}: kernel_size {kernel}, stride {stride} and dilation {dilation} "
                         f"must be >= 1")
    eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation))
    pad_type = {"not_set": "not_set", "same_upper": "same_upper", "same_lower": "same_lower",
                "valid": "valid"}.get(str(auto_pad).lower(), auto_pad)
    dilated = tuple(d * (s - 1) + 1 for d, s in zip(in_dil, t.shape[2:]))
    pads, out_sp = _resolve_pads(name, dilated, eff, stride, padding, pad_type,
                                 bool(ceil_mode))
    out_sp = tuple(o + out_pads[i] + out_pads[n + i] for i, o in enumerate(out_sp))
    attrs = {"kernel_shape": kernel, "strides": stride, "pads": pads, "dilations": dilation,
             "in_dilations": in_dil, "out_pads": out_pads}
    attrs.update(extra)
    return add_op(op_type, name, [t], [Out(f"{name}_out", t.shape[:2] + out_sp, t.dtype)],
                  attrs)[0]


def average_pool(t: Tensor, kernel_size: Sequence[int], stride: Optional[Sequence[int]] = None,
                 padding: Optional[Sequence[int]] = None,
                 out_pads: Optional[Sequence[int]] = None,
                 dilation: Optional[Sequence[int]] = None,
                 in_dilations: Optional[Sequence[int]] = None, auto_pad: str = "not_set",
                 ceil_mode: bool = False) -> Tensor:
    """ONNX AveragePool over the spatial dims of `t` (N, C, *spatial); padded cells are not
    counted in the average (count_include_pad=0).

    `in_dilations` (one per spatial dim) and `out_pads` (begins..., ends...) follow poplin's
    input and output transforms, which upstream maps them to: the input is first dilated by
    inserting d-1 zero cells between neighbours (real cells: counted in the average, and
    candidates of `max_pool`), and the pooled output is padded with zeros. (Upstream's
    reference does not define them further; this is our definition.)
    """
    return _pool("AveragePool", "average_pool", t, kernel_size, stride, padding, out_pads,
                 dilation, in_dilations, auto_pad, ceil_mode, {})


def max_pool(t: Tensor, kernel_size: Sequence[int], stride: Optional[Sequence[int]] = None,
             padding: Optional[Sequence[int]] = None, out_pads: Optional[Sequence[int]] = None,
             dilation: Optional[Sequence[int]] = None,
             in_dilations: Optional[Sequence[int]] = None, auto_pad: str = "not_set",
             ceil_mode: bool = False, storage_order: str = "row") -> Tensor:
    """ONNX MaxPool over the spatial dims of `t` (N, C, *spatial); padding never wins.
    `in_dilations` and `out_pads`: see `average_pool`."""
    if storage_order not in ("row", "column"):
        raise ValueError(f"max_pool: storage_order must be 'row' or 'column', got "
                         f"{storage_order!r}")
    return _pool("MaxPool", "max_pool", t, kernel_size, stride, padding, out_pads, dilation,
                 in_dilations, auto_pad, ceil_mode, {})


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
