"""Builder: `interpolate` (ONNX Resize with scales: nearest, n-linear and cubic)."""
from __future__ import annotations

import math
from typing import Sequence, Tuple

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

try:
    from typing import Literal
except ImportError:  # pragma: no cover
    from typing_extensions import Literal

__all__ = ["interpolate"]

InterpolateType = Literal["nearest", "linear", "cubic"]
InterpolateNearestType = Literal["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
InterpolateCoordinateTransformationType = Literal[
    "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]

_MODES = ("nearest", "linear", "cubic")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_half_pixel_for_nn")


def interpolate(t: Tensor, scale_factor: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
                mode: InterpolateType = "nearest",
                nearest_mode: InterpolateNearestType = "round_prefer_floor",
                coordinate_transformation_mode: InterpolateCoordinateTransformationType =
                "half_pixel") -> Tensor:
    """Resize `t` by `scale_factor` (one per dim) as ONNX Resize: out_dim = floor(in_dim*scale).

    Output position x maps to input coordinate (half_pixel) (x+0.5)/scale-0.5,
    (pytorch_half_pixel) the same but 0 for a size-1 output, (align_corners)
    x*(in-1)/(out-1), (asymmetric) x/scale, (tf_half_pixel_for_nn) (x+0.5)/scale. "nearest"
    rounds it by `nearest_mode`; "linear" interpolates between the two neighbours and
    "cubic" over four (A = -0.75, exclude_outside=0); neighbours outside the input repeat the
    edge. Every dim is resized independently (separable). ("tf_crop_and_resize" is not
    supported, as upstream.)

    Returns:
        The resized tensor (op type `Resize`).
    """
    name = "interpolate"
    check_tensor(t, name, "t")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name}: 't' '{t.id}' must be floating point, got {t.dtype.name}")
    for arg, v, allowed in (("mode", mode, _MODES), ("nearest_mode", nearest_mode, _NEAREST_MODES),
                            ("coordinate_transformation_mode", coordinate_transformation_mode,
                             _COORD_MODES)):
        if v not in allowed:
            names = ", ".join(allowed[:-1]) + " or " + allowed[-1]
            raise ValueError(f"interpolate type {v} is not valid, must be {names}. "
                             f"({name}: {arg})")
    scales = _scales(name, t, scale_factor)
    shape = tuple(int(math.floor(d * s)) for d, s in zip(t.shape, scales))
    if t.nelms and min(shape, default=1) < 1:
        raise ValueError(f"{name}: scale_factor {scales} gives an empty output {shape} for "
                         f"'{t.id}' {t.shape}")
    return add_op("Resize", name, [t], [Out(f"{name}_out", shape, t.dtype)],
                  {"scales": scales, "mode": mode, "nearest_mode": nearest_mode,
                   "coordinate_transformation_mode": coordinate_transformation_mode})[0]


def _scales(name: str, t: Tensor, scale_factor) -> Tuple[float, ...]:
    try:
        scales = tuple(float(s) for s in scale_factor)
    except TypeError:
        raise TypeError(f"{name}: scale_factor must be a sequence of floats, got "
                        f"{scale_factor!r}") from None
    if len(scales) != t.rank:
        raise ValueError(f"{name}: scale_factor {scales} needs one entry per dim of '{t.id}' "
                         f"{t.shape}")
    if min(scales, default=1.0) <= 0:
        raise ValueError(f"{name}: scale_factor {scales} must be positive")
    return scales
