"""Builders: normalisations (group_norm, layer_norm, batch_norm_inference), nll_loss, dropout,
conv and pooling."""
from __future__ import annotations

from typing import Any, Dict, Literal, NamedTuple, Optional, Sequence, Tuple

from popart import ReductionType

from .. import dtypes
from ..context import gcg
from ..tensor import Tensor
from ._builder import Out, add_op, check_same_dtype, check_tensor

__all__ = ["group_norm", "layer_norm", "batch_norm_inference", "nll_loss", "dropout",
           "shaped_dropout", "conv", "average_pool", "max_pool", "PadType"]


def _group_norm(opname: str, t: Tensor, weight: Tensor, bias: Tensor, num_groups: int,
                eps: float) -> Tensor:
    check_tensor(t, opname, "t")
    check_tensor(weight, opname, "weight")
    check_tensor(bias, opname, "bias")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{opname}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    check_same_dtype(opname, t, weight, bias)
    if t.rank < 2:
        raise ValueError(f"{opname}: 't' '{t.id}' must have shape (N, C, ...), got {t.shape}")
    c = t.shape[1]
    for arg, p in (("weight", weight), ("bias", bias)):
        if p.shape != (c,):
            raise ValueError(f"{opname}: '{arg}' '{p.id}' must have shape ({c},) (the channel "
                             f"dim 1 of 't' {t.shape}), got {p.shape}")
    if not isinstance(num_groups, int) or num_groups < 1 or c % num_groups:
        raise ValueError(f"{opname}: num_groups {num_groups!r} must be a positive divisor of the "
                         f"channel count {c} of 't' '{t.id}' {t.shape}")
    n_stats = t.shape[0] * num_groups
    return add_op("GroupNormalization", opname, [t, weight, bias],
                  [Out(f"{opname}_out", t.shape, t.dtype, t.meta_shape),
                   Out(f"{opname}_mean", (n_stats,), t.dtype),
                   Out(f"{opname}_inv_std_dev", (n_stats,), t.dtype)],
                  {"num_groups": num_groups, "epsilon": float(eps)})[0]


def group_norm(t: Tensor, weight: Tensor, bias: Tensor, num_groups: int,
               eps: float = 1e-5) -> Tensor:
    """Group normalisation of `t` (N, C, *spatial) with per-channel `weight` and `bias` (C,).

    Each sample's channels are split into `num_groups` groups, normalised over the group's
    channels and all spatial positions with the biased variance: y = (x-mean)/sqrt(var+eps).
    """
    return _group_norm("group_norm", t, weight, bias, num_groups, eps)


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """`group_norm` with one group: normalises all non-batch dims together; weight and bias have
    shape (t.shape[1],). For last-dim layer norm, reshape `t` to 2-D first."""
    return _group_norm("layer_norm", t, weight, bias, 1, eps)


def batch_norm_inference(t: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                         epsilon: float = 1e-5, momentum: float = 0.9) -> Tensor:
    """y = scale*(x-mean)/sqrt(var+eps) + bias over channel axis 1 (running statistics given).

    `momentum` is accepted for API compatibility; inference does not update statistics.
    """
    name = "batch_norm_inference"
    check_tensor(t, name, "t")
    params = (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))
    for arg, p in params:
        check_tensor(p, name, arg)
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    check_same_dtype(name, t, *(p for _, p in params))
    if t.rank < 2:
        raise ValueError(f"{name}: 't' '{t.id}' must have shape (N, C, ...), got {t.shape}")
    c = t.shape[1]
    for arg, p in params:
        if p.shape != (c,):
            raise ValueError(f"{name}: '{arg}' '{p.id}' must have shape ({c},) (the channel dim "
                             f"1 of 't' {t.shape}), got {p.shape}")
    return add_op("BatchNormalization", name, [t, scale, bias, mean, var],
                  [Out(f"{name}_out", t.shape, t.dtype, t.meta_shape)],
                  {"epsilon": float(epsilon), "momentum": float(momentum)})[0]


REDUCTION_TYPE = Literal["mean", "sum", "none"]
REDUCTION_MAP = {"mean": ReductionType.Mean, "sum": ReductionType.Sum,
                 "none": ReductionType.NoReduction}
_REDUCTIONS = tuple(REDUCTION_MAP)


def nll_loss(probs: Tensor, labels: Tensor, ignore_index: Optional[int] = None,
             reduction: str = "mean", log_prob: bool = False) -> Tensor:
    """Negative log likelihood of `probs` (..., C) at integer `labels` (...).

    Per sample: -log(max(p[label], eps)) (eps 1e-7 for float32, 6.104e-5 for float16), or
    -p[label] when `log_prob`. "mean" divides by the count of non-ignored samples (at least 1);
    samples whose label is `ignore_index` contribute 0.

    Returns:
        `loss`: a scalar, or shaped like `labels` for reduction "none".
    """
    name = "nll_loss"
    check_tensor(probs, name, "probs")
    check_tensor(labels, name, "labels")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Not a valid reduction: {reduction}. Must choose from: "
                         f"{', '.join(_REDUCTIONS)}")
    if not probs.dtype.is_floating_point:
        raise TypeError(f"{name}: probs '{probs.id}' must be floating point, got "
                        f"{probs.dtype.name}")
    if not labels.dtype.is_int:
        raise TypeError(f"{name}: labels '{labels.id}' must be integer class ids, got "
                        f"{labels.dtype.name}")
    if probs.rank < 1 or labels.nelms * probs.shape[-1] != probs.nelms:
        raise ValueError(f"{name}: probs '{probs.id}' {probs.shape} and labels '{labels.id}' "
                         f"{labels.shape} do not match: need probs (..., C) with one label per "
                         f"row")
    loss_shape = labels.shape if reduction == "none" else ()
    return add_op("Nll", name, [probs, labels], [Out("loss", loss_shape, probs.dtype)],
                  {"ignore_index": None if ignore_index is None else int(ignore_index),
                   "reduction": reduction, "log_prob": bool(log_prob)})[0]


def _check_seed(opname: str, seed: Tensor) -> None:
    check_tensor(seed, opname, "seed_tensor")
    if seed.dtype != dtypes.uint32 or seed.shape != (2,):
        raise ValueError(f"{opname}: 'seed_tensor' '{seed.id}' must be uint32 of shape (2,), got "
                         f"{seed.dtype.name} {seed.shape}")


def _check_ratio(opname: str, p: float) -> float:
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise TypeError(f"{opname}: the ratio must be a float, got {p!r}") from None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{opname}: the ratio must be in [0, 1), got {p}")
    return p


def dropout(t: Tensor, seed_tensor: Tensor, p: float) -> Tensor:
    """Zero each element with probability `p` and scale the survivors by 1/(1-p), always.

    The mask is a deterministic function of the uint32 (2,) `seed_tensor` (NumPy Philox; it does
    not match the IPU's random stream). The gradient applies the same mask.
    """
    check_tensor(t, "dropout", "t")
    _check_seed("dropout", seed_tensor)
    p = _check_ratio("dropout", p)
    if not t.dtype.is_floating_point:
        raise TypeError(f"dropout: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    return add_op("Dropout", "dropout", [t, seed_tensor],
                  [Out("dropout_out", t.shape, t.dtype, t.meta_shape)], {"ratio": p})[0]


def shaped_dropout(t: Tensor, seed_tensor: Tensor, shape: Sequence[int], ratio: float) -> Tensor:
    """Dropout whose mask has shape `shape`, broadcast onto `t` (e.g. drop whole rows)."""
    check_tensor(t, "shaped_dropout", "t")
    _check_seed("shaped_dropout", seed_tensor)
    ratio = _check_ratio("shaped_dropout", ratio)
    if not t.dtype.is_floating_point:
        raise TypeError(f"shaped_dropout: 't' '{t.id}' must be floating point, got "
                        f"{t.dtype.name}")
    shape = tuple(int(s) for s in shape)
    ok = len(shape) <= t.rank and all(
        s in (1, d) for s, d in zip(reversed(shape), reversed(t.shape)))
    if not ok:
        raise ValueError(f"shaped_dropout: mask shape {shape} cannot be broadcast onto 't' "
                         f"'{t.id}' {t.shape}")
    return add_op("ShapedDropout", "shaped_dropout", [t, seed_tensor],
                  [Out("shaped_dropout_out", t.shape, t.dtype, t.meta_shape)],
                  {"ratio": ratio, "shape": shape})[0]


# --- convolution and pooling ------------------------------------------------------------------

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
