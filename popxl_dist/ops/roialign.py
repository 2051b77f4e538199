"""Builder: `roi_align` (ONNX RoiAlign, opset 10: average mode, no half-pixel offset)."""
from __future__ import annotations

from typing import Tuple

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["roi_align"]


def roi_align(t: Tensor, rois: Tensor, batch_index: Tensor, output_size: Tuple[int, int],
              spatial_scale: float, sampling_ratio: int) -> Tensor:
    """Average-pool each region of interest of `t` into an `output_size` grid (ONNX RoiAlign).

    Each roi [x1, y1, x2, y2] is scaled by `spatial_scale`; its height and width (at least 1)
    are split into output_size bins; each bin averages `sampling_ratio`^2 bilinear samples at
    regularly spaced points (or ceil(roi_size/output_size) per dim when `sampling_ratio` is 0).
    Samples beyond one pixel outside the map are 0; others clamp to the edge.

    Args:
        t: (N, C, H, W) features.
        rois: (num_rois, 4) boxes, the dtype of `t`.
        batch_index: (num_rois,) integer image index of each roi.
        output_size: (out_h, out_w).
        spatial_scale: scale from roi coordinates to `t`'s pixels.
        sampling_ratio: samples per bin and dim; 0 is adaptive.

    Returns:
        (num_rois, C, out_h, out_w) (op type `RoiAlign`; the gradient reaches `t` only).
    """
    name = "roi_align"
    check_tensor(t, name, "t")
    check_tensor(rois, name, "rois")
    check_tensor(batch_index, name, "batch_index")
    if not t.dtype.is_floating_point or t.rank != 4:
        raise TypeError(f"{name}: 't' '{t.id}' must be a floating point (N, C, H, W) tensor, got "
                        f"{t.dtype.name} {t.shape}")
    if rois.dtype != t.dtype or rois.rank != 2 or rois.shape[1] != 4:
        raise ValueError(f"{name}: 'rois' '{rois.id}' must be (num_rois, 4) of dtype "
                         f"{t.dtype.name}, got {rois.dtype.name} {rois.shape}")
    if not batch_index.dtype.is_int or batch_index.shape != rois.shape[:1]:
        raise ValueError(f"{name}: 'batch_index' '{batch_index.id}' must be integer of shape "
                         f"({rois.shape[0]},), got {batch_index.dtype.name} {batch_index.shape}")
    try:
        out_h, out_w = (int(v) for v in output_size)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: output_size must be (height, width), got "
                        f"{output_size!r}") from None
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{name}: output_size must be positive, got {output_size!r}")
    if not isinstance(sampling_ratio, int) or sampling_ratio < 0:
        raise ValueError(f"{name}: sampling_ratio must be an int >= 0, got {sampling_ratio!r}")
    shape = (rois.shape[0], t.shape[1], out_h, out_w)
    return add_op("RoiAlign", name, [t, rois, batch_index], [Out(f"{name}_out", shape, t.dtype)],
                  {"output_size": (out_h, out_w), "spatial_scale": float(spatial_scale),
                   "sampling_ratio": sampling_ratio})[0]
