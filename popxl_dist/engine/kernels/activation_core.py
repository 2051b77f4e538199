"""Kernels: Gelu (tanh approximation) and its grad, Softmax and its grad, fused NLL + softmax grad."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, np_dtype, via_f32
from .registry import kernel

_K = np.float32(np.sqrt(2.0 / np.pi))
_C = np.float32(0.044715)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x * x
    t *= _C * x
    t += x
    t *= _K
    np.tanh(t, out=t)
    t += 1
    t *= x
    t *= 0.5
    return t


def gelu_tanh_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    x2 = x * x
    inner = (x2 * _C + 1) * x * _K
    th = np.tanh(inner)
    dinner = (x2 * (3 * _C) + 1) * _K
    # d/dx 0.5 x (1 + tanh(u)) = 0.5 (1 + tanh) + 0.5 x (1 - tanh^2) u'
    sech2 = 1 - th * th
    g = 0.5 * (1 + th) + 0.5 * x * sech2 * dinner
    g *= dy
    return g


@kernel("Gelu")
def _gelu(attrs, ins, outs):
    return via_f32(gelu_tanh, np_dtype(outs[0]))


@kernel("GeluInplace", modifies=(0,))
def _gelu_inplace(attrs, ins, outs):
    f = via_f32(gelu_tanh, np_dtype(outs[0]))

    def run(x):
        x[...] = f(x)
        return x
    return run


@kernel("GeluGrad")
def _gelu_grad(attrs, ins, outs):
    return via_f32(gelu_tanh_grad, np_dtype(outs[0]))


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = x - np.max(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


@kernel("Softmax")
def _softmax(attrs, ins, outs):
    axis = int(attrs["axis"])
    return via_f32(lambda x: softmax(x, axis), np_dtype(outs[0]))


@kernel("SoftmaxGrad")
def _softmax_grad(attrs, ins, outs):
    axis = int(attrs["axis"])

    def run(dy, y):
        g = dy * y
        g -= y * np.sum(g, axis=axis, keepdims=True)
        return g
    return via_f32(run, np_dtype(outs[0]))


@kernel("NlllWithSoftmaxGradDirect")
def _nll_softmax_grad(attrs, ins, outs):
    ignore = attrs.get("ignore_index")
    reduction = attrs.get("reduction", "mean")
    loss_dt, dx_dt = np_dtype(outs[0]), np_dtype(outs[1])
    n_classes = ins[0].shape[-1]
    loss_shape = outs[0].shape

    def run(probs, labels, loss_grad):
        p = probs.reshape(-1, n_classes)
        if p.dtype == F16:
            p = p.astype(F32)
        lab = labels.reshape(-1).astype(np.int64, copy=False)
        rows = np.arange(lab.shape[0])
        valid = None if ignore is None else (lab != ignore)
        safe = lab if valid is None else np.where(valid, lab, 0)
        picked = p[rows, safe]
        loss = -np.log(picked + np.float32(1e-7))
        dx = p.copy()
        dx[rows, safe] -= 1
        if valid is not None:
            loss = np.where(valid, loss, 0).astype(loss.dtype)
            dx[~valid] = 0
            count = max(int(valid.sum()), 1)
        else:
            count = max(lab.shape[0], 1)
        g = np.float32(np.asarray(loss_grad).reshape(()))
        if reduction == "mean":
            total = np.float32(loss.sum(dtype=F32) / count)
            dx *= g / np.float32(count)
            loss_out = np.asarray(total, dtype=loss_dt)
        elif reduction == "sum":
            loss_out = np.asarray(loss.sum(dtype=F32), dtype=loss_dt)
            dx *= g
        else:
            loss_out = loss.reshape(loss_shape).astype(loss_dt)
            dx *= g
        return loss_out, dx.reshape(probs.shape).astype(dx_dt, copy=False)
    return run
