"""`LinearFP8`: a dense layer whose matmuls run in float8 (forward float8_143, gradients
float8_152), with a hand-written `build_grad`."""
from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..ops.fp8_amax_scale import fp8_amax_scale
from ..ops.fp8_mse_scale import fp8_mse_scale
from ..utils import WeightsDict
from ._init import truncnorm
from .linear import Linear

__all__ = ["LinearFP8"]

_METRICS = ("amax", "mse", "manual_scale")
# Each operand's scale is clipped to this range so that the sum of two of them, which
# matmul_pow2scaled undoes, stays in its log2_scale range [-32, 32).
_SCALE_RANGE = (-16, 15)


class LinearFP8(Module):
    """y = x @ W + b with the matmul in float8.

    `weight` (in, out) and `bias` (out,) are kept in `x.dtype` (float16 or float32). Each
    forward casts x and W to `forward_fp8_type` (float8_143) with their own log2 scales and
    multiplies them with `ops.matmul_pow2scaled`, undoing both scales; `build_grad` casts the
    output gradient to `grad_fp8_type` (float8_152) and computes dx = dy @ W^T and
    dW = x^T @ dy the same way from the float8 tensors saved by the forward.

    Args:
        out_features: output width.
        bias: add a bias.
        scale_metric: how scales are chosen: "amax" (`fp8_amax_scale`, the largest scale that
            cannot overflow), "mse" (`fp8_mse_scale`) or "manual_scale" (`scale` for every
            tensor).
        scale: the log2 scale of "manual_scale".
        replica_grouping: grouping of the variables.

    Deviation: scales are clipped to [-16, 15] so that the combined scale of each matmul
    stays within `matmul_pow2scaled`'s [-32, 32).
    """

    def __init__(self, out_features: int, bias: bool = True, scale_metric: str = "amax",
                 scale: int = 0, replica_grouping: Optional[popxl.ReplicaGrouping] = None):
        super().__init__()
        if scale_metric not in _METRICS:
            raise ValueError(f"LinearFP8: scale_metric must be one of {_METRICS}, got "
                             f"{scale_metric!r}")
        if not isinstance(scale, (int, np.integer)) or not -32 <= int(scale) < 32:
            raise ValueError(f"LinearFP8: scale must be an int in [-32, 32), got {scale!r}")
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping
        self.scale_metric = scale_metric
        self.scale = int(scale)
        self.forward_fp8_type = popxl.float8_143
        self.grad_fp8_type = popxl.float8_152
        self.fp8_scale = {"amax": fp8_amax_scale, "mse": fp8_mse_scale,
                          "manual_scale": self._manual_scale}[scale_metric]

    def _manual_scale(self, src: popxl.Tensor, dtype: popxl.dtype) -> popxl.Tensor:
        return popxl.constant(np.int32(self.scale), popxl.int32, "manual_scale")

    def _cast(self, t: popxl.Tensor, dtype: popxl.dtype):
        """(float8 t, its log2 scale) for t (at most 2-D views are needed by the matmuls)."""
        s = ops.clip(ops.cast(self.fp8_scale(t, dtype), popxl.float32), *map(float, _SCALE_RANGE))
        s = ops.cast(s, popxl.int32)
        return ops.pow2scale_cast_to_fp8(t, s, dtype), s

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        if x.dtype not in (popxl.float16, popxl.float32):
            raise TypeError(f"LinearFP8: x must be float16 or float32, got {x.dtype.name}")
        w = self.add_variable_input("weight", partial(truncnorm, (x.shape[-1], self.out_features)),
                                    x.dtype, replica_grouping=self.replica_grouping)
        x8, sx = self._cast(x, self.forward_fp8_type)
        w8, sw = self._cast(w, self.forward_fp8_type)
        y = ops.matmul_pow2scaled(x8, w8, ops.negate(sx + sw))
        if y.dtype != x.dtype:
            y = ops.cast(y, x.dtype)
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, self.out_features), x.dtype,
                                        replica_grouping=self.replica_grouping)
            y = y + b
        self.aux["x8"], self.aux["sx"] = x8, sx
        self.aux["w8"], self.aux["sw"] = w8, sw
        return y

    def build_grad(self, dLdy: popxl.Tensor) -> popxl.Tensor:
        x8, sx, w8, sw = self.aux["x8"], self.aux["sx"], self.aux["w8"], self.aux["sw"]
        g8, sg = self._cast(dLdy, self.grad_fp8_type)
        dx = ops.matmul_pow2scaled(g8, w8.transpose(), ops.negate(sg + sw))
        x2 = x8.reshape((-1, x8.shape[-1]))
        g2 = g8.reshape((-1, g8.shape[-1]))
        dw = ops.matmul_pow2scaled(x2.transpose(), g2, ops.negate(sx + sg))
        if dw.dtype != dLdy.dtype:
            dw = ops.cast(dw, dLdy.dtype)
        self.var_grad["weight"] = dw
        if self.bias:
            self.var_grad["bias"] = ops.sum(dLdy.reshape((-1, dLdy.shape[-1])), 0)
        return dx if dx.dtype == dLdy.dtype else ops.cast(dx, dLdy.dtype)

    @staticmethod
    def torch_mapping(variables: NamedTensors, nn_layer, dtype: popxl.dtype = popxl.float32
                      ) -> WeightsDict:
        """{variable: data} from a `torch.nn.Linear` (as `Linear.torch_mapping`)."""
        return Linear.torch_mapping(variables, nn_layer, dtype)
