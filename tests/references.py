"""NumPy references that several tests compare against, written here from the operations'
definitions (ONNX, and PyTorch's documented semantics where a test checks torch-compatible
behaviour), independent of the emulator's kernels. Everything computes in float64.

`conv` is ONNX Conv by its definition (a sum over kernel offsets); `linear_vjp` is the
transposed Jacobian of a linear map, built column by column from the map itself, which gives
conv's gradients and `conv_transpose` (the adjoint of conv) without a second hand-written
kernel. The activations come with their first and second derivatives for the second-order
gradient tests. `TorchLikeLayer` stands in for a `torch.nn` layer where a test checks a
`torch_mapping`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

__all__ = ["conv", "conv_transpose", "linear_vjp", "pool2d", "softmax", "gelu_tanh",
           "gelu_erf", "layer_norm", "cross_entropy", "TorchLikeTensor", "TorchLikeLayer"]

F64 = np.float64


def _per_dim(value, nd: int, default: int) -> Tuple[int, ...]:
    if value is None:
        return (default,) * nd
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * nd


def conv(x: np.ndarray, w: np.ndarray, stride=None, pads=None, dilation=None,
         groups: int = 1) -> np.ndarray:
    """ONNX Conv without bias. x (N, C, *S), w (M, C / groups, *K); `pads` are ONNX's
    (begin_0, ..., begin_n, end_0, ..., end_n), zeros."""
    nd = x.ndim - 2
    stride, dilation = _per_dim(stride, nd, 1), _per_dim(dilation, nd, 1)
    pads = tuple(pads) if pads is not None else (0,) * (2 * nd)
    xp = np.pad(x.astype(F64), [(0, 0), (0, 0)] + [(pads[d], pads[nd + d]) for d in range(nd)])
    k = w.shape[2:]
    out = tuple((xp.shape[2 + d] - dilation[d] * (k[d] - 1) - 1) // stride[d] + 1
                for d in range(nd))
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // groups, m // groups
    y = np.zeros((n, m) + out)
    for kk in np.ndindex(*k):
        window = tuple(slice(kk[d] * dilation[d], kk[d] * dilation[d] + stride[d] * (out[d] - 1)
                             + 1, stride[d]) for d in range(nd))
        patch = xp[(slice(None), slice(None)) + window]          # (N, C, *out)
        for g in range(groups):
            wk = w[(slice(g * mg, (g + 1) * mg), slice(None)) + kk].astype(F64)   # (mg, cg)
            y[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...",
                                                   patch[:, g * cg:(g + 1) * cg], wk)
    return y


def linear_vjp(fn: Callable[[np.ndarray], np.ndarray], in_shape: Sequence[int],
               dy: np.ndarray) -> np.ndarray:
    """J^T dy for a linear map `fn` on arrays of `in_shape`: column i of J is fn(e_i)."""
    dy = np.asarray(dy, F64)
    out = np.zeros(int(np.prod(in_shape)))
    for i in range(out.size):
        e = np.zeros(out.size)
        e[i] = 1.0
        out[i] = np.sum(fn(e.reshape(in_shape)) * dy)
    return out.reshape(in_shape)


def conv_transpose(x: np.ndarray, w: np.ndarray, stride=None, pads=None, dilation=None,
                   groups: int = 1, output_padding=None) -> np.ndarray:
    """ONNX ConvTranspose (PyTorch's conv_transpose with symmetric pads): the adjoint of `conv`
    with the same weights. x (N, C, *S), w (C, M / groups, *K)."""
    nd = x.ndim - 2
    stride, dilation = _per_dim(stride, nd, 1), _per_dim(dilation, nd, 1)
    pads = tuple(pads) if pads is not None else (0,) * (2 * nd)
    output_padding = _per_dim(output_padding, nd, 0)
    k = w.shape[2:]
    out = tuple(stride[d] * (x.shape[2 + d] - 1) + output_padding[d]
                + (k[d] - 1) * dilation[d] + 1 - pads[d] - pads[nd + d] for d in range(nd))
    z_shape = (x.shape[0], w.shape[1] * groups) + out
    return linear_vjp(lambda z: conv(z, w, stride, pads, dilation, groups), z_shape, x)


def pool2d(x: np.ndarray, mode: str, kernel, stride=None, pads=(0, 0, 0, 0), dilation=(1, 1),
           ceil_mode: bool = False) -> np.ndarray:
    """Max or average pooling of x (N, C, H, W) over windows of `kernel` cells, as PyTorch's
    max_pool2d / avg_pool2d(count_include_pad=False): padding (top, left, bottom, right, as
    ONNX's begins then ends) never wins a max and is not counted in an average. With
    `ceil_mode` the last window may run past the end if it starts inside the input or its
    begin padding."""
    stride = tuple(stride or kernel)
    size = x.shape[2:]
    out = []
    for d in range(2):
        span = size[d] + pads[d] + pads[2 + d] - dilation[d] * (kernel[d] - 1) - 1
        o = (-(-span // stride[d]) if ceil_mode else span // stride[d]) + 1
        if ceil_mode and (o - 1) * stride[d] >= size[d] + pads[d]:
            o -= 1
        out.append(o)
    y = np.zeros(x.shape[:2] + tuple(out))
    xf = x.astype(F64)
    for o in np.ndindex(*out):
        rows, cols = ([o[d] * stride[d] - pads[d] + j * dilation[d] for j in range(kernel[d])]
                      for d in range(2))
        rows = [r for r in rows if 0 <= r < size[0]]
        cols = [c for c in cols if 0 <= c < size[1]]
        cells = xf[:, :, rows][:, :, :, cols].reshape(x.shape[:2] + (-1,))
        y[(slice(None), slice(None)) + o] = cells.max(-1) if mode == "max" else cells.mean(-1)
    return y


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu_tanh(z: np.ndarray, derivative: int = 0) -> np.ndarray:
    """GELU's tanh approximation 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))), or its first
    or second derivative."""
    z = np.asarray(z, F64)
    u = _SQRT_2_OVER_PI * (z + _GELU_A * z ** 3)
    du = _SQRT_2_OVER_PI * (1 + 3 * _GELU_A * z ** 2)
    ddu = _SQRT_2_OVER_PI * 6 * _GELU_A * z
    t = np.tanh(u)
    sech2 = 1 - t ** 2
    if derivative == 0:
        return 0.5 * z * (1 + t)
    if derivative == 1:
        return 0.5 * (1 + t) + 0.5 * z * sech2 * du
    return sech2 * du + 0.5 * z * sech2 * (ddu - 2 * t * du ** 2)


def gelu_erf(z: np.ndarray, derivative: int = 0) -> np.ndarray:
    """Exact GELU z Phi(z), or its first or second derivative."""
    z = np.asarray(z, F64)
    phi = np.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi)
    if derivative == 0:
        return 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    if derivative == 1:
        return 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2))) + z * phi
    return phi * (2 - z ** 2)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: Optional[np.ndarray] = None,
               eps: float = 1e-5):
    """Layer norm over the last axis (biased variance), y = x_hat * w + b; with `dy` also
    (dx, dw, db) of sum(y * dy)."""
    x = np.asarray(x, F64)
    mean = x.mean(-1, keepdims=True)
    inv = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xhat = (x - mean) * inv
    y = xhat * w + b
    if dy is None:
        return y
    dy = np.asarray(dy, F64)
    dxhat = dy * w
    dx = inv * (dxhat - dxhat.mean(-1, keepdims=True)
                - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    batch = tuple(range(x.ndim - 1))
    return y, dx, (dy * xhat).sum(axis=batch), dy.sum(axis=batch)


def cross_entropy(logits: np.ndarray, labels: np.ndarray, reduction: str = "mean",
                  ignore_index: int = -100, dloss: Optional[np.ndarray] = None):
    """Softmax cross entropy of logits (N, C) against class indices (N,), as PyTorch's
    `cross_entropy`: rows labelled `ignore_index` contribute nothing (and "mean" divides by the
    rows that count). With `dloss` (the loss's gradient: a scalar, or (N,) for "none") also
    the logits' gradient."""
    logits = np.asarray(logits, F64)
    valid = labels != ignore_index
    safe = np.where(valid, labels, 0)
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    per_row = np.where(valid, -logp[np.arange(len(labels)), safe], 0.0)
    count = max(int(valid.sum()), 1)
    loss = {"none": per_row, "sum": per_row.sum(), "mean": per_row.sum() / count}[reduction]
    if dloss is None:
        return loss
    onehot = np.zeros_like(logits)
    onehot[np.arange(len(labels)), safe] = 1.0
    d_row = np.broadcast_to(np.asarray(dloss, F64), per_row.shape) / \
        (count if reduction == "mean" else 1)
    dlogits = (np.exp(logp) - onehot) * np.where(valid, d_row, 0.0)[:, None]
    return loss, dlogits


class TorchLikeTensor:
    """What `torch_mapping` reads of a torch parameter (`.data`, `.T`, `.numpy()`), over a
    NumPy array: the layers' torch mappings are tested without torch."""

    def __init__(self, array: np.ndarray):
        self._array = np.asarray(array)

    @property
    def data(self) -> "TorchLikeTensor":
        return self

    @property
    def T(self) -> "TorchLikeTensor":  # noqa: N802 - torch's name
        return TorchLikeTensor(self._array.T)

    def numpy(self) -> np.ndarray:
        return self._array


class TorchLikeLayer:
    """A stand-in for a `torch.nn` layer: its parameters (torch's shapes, e.g. a Linear's
    weight is (out, in)) as `TorchLikeTensor` attributes; None for an absent bias."""

    def __init__(self, **params: Optional[np.ndarray]):
        for name, value in params.items():
            setattr(self, name, None if value is None else TorchLikeTensor(value))
