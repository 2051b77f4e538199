"""Compiled element-wise loops for the fused kernels (numba, the `fast` extra; imported only
through `_util.jit_loops()`).

Each loop performs, per element, exactly the float32 operations of the NumPy definition it
replaces, in the same order (no fused multiply-add, no reassociation: numba's default IEEE
mode), so the results are the same bits; transcendental functions (tanh, exp) stay NumPy's, whose
results differ from libm's. One pass instead of one NumPy pass per operation.
"""
import math

import numpy as np
from numba import njit

__all__ = ["gelu_inner", "gelu_outer", "gelu_grad_inner", "gelu_grad_outer", "moving_average",
           "adam_update", "adam_update_wd", "axpy", "scatter_add_rows"]

# (Kernels call these for 4096 elements or more: below, numba's per-call dispatch costs more
# than the NumPy passes.)

_F = np.float32
_C = _F(0.044715)
_K = _F(np.sqrt(2.0 / np.pi))
_C3 = _F(3) * _C
_ONE = _F(1)
_HALF = _F(0.5)


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_inner(x, u):
    """u = (x * x * (C * x) + x) * K (the argument of tanh in GELU)."""
    for i in range(x.size):
        v = x[i]
        t = v * v
        t = t * (_C * v)
        t = t + v
        u[i] = t * _K


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_outer(x, t, y):
    """y = (tanh(u) + 1) * x * 0.5."""
    for i in range(x.size):
        y[i] = ((t[i] + _ONE) * x[i]) * _HALF


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_grad_inner(x, x2, u):
    """x2 = x * x; u = (x2 * C + 1) * x * K."""
    for i in range(x.size):
        v = x[i]
        s = v * v
        x2[i] = s
        u[i] = ((s * _C + _ONE) * v) * _K


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_grad_outer(dy, x, x2, th, g):
    """g = (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * ((x2 * 3C + 1) * K)) * dy."""
    for i in range(x.size):
        t = th[i]
        dinner = (x2[i] * _C3 + _ONE) * _K
        d = (_ONE + t) * _HALF
        sech2 = _ONE - t * t
        e = ((_HALF * x[i]) * sech2) * dinner
        g[i] = (d + e) * dy[i]


@njit(nogil=True, cache=True, error_model="numpy")
def moving_average(t, x, a, b, square, use_a):
    """t = [t * a] + (x [* x]) * b (b applied only when != 1, as the NumPy kernel)."""
    scale = b != _ONE
    for i in range(t.size):
        xv = x[i]
        if square:
            xv = xv * xv
        if scale:
            xv = xv * b
        tv = t[i]
        if use_a:
            tv = tv * a
        t[i] = tv + xv


@njit(nogil=True, cache=True, error_model="numpy")
def adam_update(m, v, out, dm, dv, eps):
    """out = (m / dm) / (sqrt(v / dv) + eps) (Adam / Lamb with bias correction)."""
    for i in range(out.size):
        out[i] = (m[i] / dm) / (math.sqrt(v[i] / dv) + eps)


@njit(nogil=True, cache=True, error_model="numpy")
def adam_update_wd(m, v, w, out, dm, dv, eps, wd):
    """out = (m / dm) / (sqrt(v / dv) + eps) + w * wd."""
    for i in range(out.size):
        out[i] = (m[i] / dm) / (math.sqrt(v[i] / dv) + eps) + w[i] * wd


@njit(nogil=True, cache=True, error_model="numpy")
def axpy(x, y, b):
    """x = x + b * y."""
    for i in range(x.size):
        x[i] = x[i] + b * y[i]


@njit(nogil=True, cache=True, error_model="numpy")
def scatter_add_rows(out, idx, rows):
    """out[idx[k], :] += rows[k, :] for k = 0..N-1 in order (out (D, W), rows (N, W), one dtype):
    the sequential loop itself."""
    for k in range(idx.size):
        d = idx[k]
        for j in range(out.shape[1]):
            out[d, j] = out[d, j] + rows[k, j]
