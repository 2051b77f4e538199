"""Compiled element-wise loops for the fused kernels (numba, the `fast` extra; imported only
through `_util.jit_loops()`).

Each loop performs, per element, exactly the float32 operations of the NumPy definition it
replaces, in the same order (no fused multiply-add, no reassociation: numba's default IEEE
mode), so the results are the same bits; transcendental functions (tanh, exp) stay NumPy's, whose
results differ from libm's. One pass instead of one NumPy pass per operation.

Loops that read with `load` and write with `put` take float16 arrays (as uint16 views) as well
as float32 ones: numba compiles a version per dtype, which converts as it loads and rounds once
as it stores (the float16 kernels' "compute in float32, round once"), instead of a conversion
pass before and a rounding pass after.
"""
import math

import numpy as np
from numba import njit

from ._f16_jit import _ext16, load, put, trunc16

__all__ = ["gelu_inner", "gelu_outer", "gelu_grad_inner", "gelu_grad_outer", "gelu_outer_into",
           "gelu_grad_outer_into", "moving_average",
           "adam_update", "adam_update_wd", "axpy", "scaled_add", "binary_rows",
           "binary_rows_into", "scatter_add_rows", "row_sum",
           "layer_norm_rows", "layer_norm_grad_rows", "softmax_shift_rows", "softmax_scale_rows",
           "softmax_scale_rows_to", "softmax_grad_rows", "softmax_grad_rows_to"]

# (Kernels call these at every size: one dispatch, a few microseconds, costs less than the NumPy
# passes it replaces even on a few hundred elements, where each NumPy call is ~1 us of overhead:
# GPT-3 tiny's LayerNorm grad at (8, 64) 46 -> 22 us. Issue 23 "none slower".)

_F = np.float32
_C = _F(0.044715)
_K = _F(np.sqrt(2.0 / np.pi))
_C3 = _F(3) * _C
_ONE = _F(1)
_HALF = _F(0.5)
_LANES = 16          # independent running maxima: one vector of float32


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_inner(x, u):
    """u = (x * x * (C * x) + x) * K (the argument of tanh in GELU)."""
    for i in range(x.size):
        v = load(x, i)
        t = v * v
        t = t * (_C * v)
        t = t + v
        u[i] = t * _K


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_outer(x, t, y):
    """y = (tanh(u) + 1) * x * 0.5."""
    for i in range(x.size):
        put(y, i, ((t[i] + _ONE) * load(x, i)) * _HALF)


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_grad_inner(x, x2, u):
    """x2 = x * x; u = (x2 * C + 1) * x * K."""
    for i in range(x.size):
        v = load(x, i)
        s = v * v
        x2[i] = s
        u[i] = ((s * _C + _ONE) * v) * _K


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _gelu_grad_at(dy, x, x2, t):
    """(0.5 * (1 + t) + 0.5 * x * (1 - t * t) * ((x2 * 3C + 1) * K)) * dy."""
    dinner = (x2 * _C3 + _ONE) * _K
    d = (_ONE + t) * _HALF
    sech2 = _ONE - t * t
    e = ((_HALF * x) * sech2) * dinner
    return (d + e) * dy


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_grad_outer(dy, x, x2, th, g):
    """g = the GELU gradient from dy, x, x2 = x * x and th = tanh(inner)."""
    for i in range(x.size):
        put(g, i, _gelu_grad_at(load(dy, i), load(x, i), x2[i], th[i]))


# (An output that is an input's own buffer, as the memory plan hands over, goes to the `_into`
# loops, which are given that buffer once: two arrays on one buffer keep LLVM from vectorising,
# 2.5-4x slower.)

@njit(nogil=True, cache=True, error_model="numpy")
def gelu_outer_into(x, t):
    """gelu_outer with y x's own buffer: x = (tanh(u) + 1) * x * 0.5."""
    for i in range(x.size):
        put(x, i, ((t[i] + _ONE) * load(x, i)) * _HALF)


@njit(nogil=True, cache=True, error_model="numpy")
def gelu_grad_outer_into(dy, x, x2, th, into_dy):
    """gelu_grad_outer with g dy's own buffer (into_dy), else x's."""
    if into_dy:
        for i in range(x.size):
            put(dy, i, _gelu_grad_at(load(dy, i), load(x, i), x2[i], th[i]))
    else:
        for i in range(x.size):
            put(x, i, _gelu_grad_at(load(dy, i), load(x, i), x2[i], th[i]))


@njit(nogil=True, cache=True, error_model="numpy")
def moving_average(t, x, a, b, square, use_a, round_x):
    """t = [t * a] + (x' [* x']) * b, x' = x [rounded to float16 first] (b applied only when
    != 1, as the NumPy kernel); float16 operands as uint16 views."""
    scale = b != _ONE
    for i in range(t.size):
        xv = load(x, i)
        if round_x:          # x float32 rounded to t's float16 as NumPy's cast (see `load`)
            xv = _ext16(trunc16(xv))
        if square:
            xv = xv * xv
        if scale:
            xv = xv * b
        tv = load(t, i)
        if use_a:
            tv = tv * a
        put(t, i, tv + xv)


@njit(nogil=True, cache=True, error_model="numpy")
def adam_update(m, v, out, dm, dv, eps):
    """out = (m / dm) / (sqrt(v / dv) + eps) (Adam / Lamb with bias correction)."""
    for i in range(out.size):
        put(out, i, (load(m, i) / dm) / (math.sqrt(load(v, i) / dv) + eps))


@njit(nogil=True, cache=True, error_model="numpy")
def adam_update_wd(m, v, w, out, dm, dv, eps, wd):
    """out = (m / dm) / (sqrt(v / dv) + eps) + w * wd."""
    for i in range(out.size):
        put(out, i, (load(m, i) / dm) / (math.sqrt(load(v, i) / dv) + eps) + load(w, i) * wd)


@njit(nogil=True, cache=True, error_model="numpy")
def axpy(x, y, b):
    """x = x + b * y."""
    for i in range(x.size):
        put(x, i, load(x, i) + b * load(y, i))


@njit(nogil=True, cache=True, error_model="numpy")
def scaled_add(x, y, a, b):
    """x = x * a + y * b."""
    for i in range(x.size):
        put(x, i, load(x, i) * a + load(y, i) * b)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _binop(op, x, y):
    if op == 0:
        return x + y
    if op == 1:
        return x - y
    return x * y


@njit(nogil=True, cache=True, error_model="numpy")
def binary_rows(op, a, b, out, k, a_row, b_row):
    """out = a (op) b over rows of k elements, op 0 add, 1 subtract, 2 multiply; `a_row` /
    `b_row`: that operand is one row repeated. 1-D operands, float16 as uint16 views; `out`
    shares no memory with a or b (see `binary_rows_into`)."""
    if k == 1 and b_row:                     # a scalar operand
        bv = load(b, 0)
        for i in range(out.size):
            put(out, i, _binop(op, load(a, i), bv))
        return
    if k == 1 and a_row:
        av = load(a, 0)
        for i in range(out.size):
            put(out, i, _binop(op, av, load(b, i)))
        return
    for r in range(out.size // k):
        oa = 0 if a_row else r * k
        ob = 0 if b_row else r * k
        o = r * k
        for j in range(k):
            put(out, o + j, _binop(op, load(a, oa + j), load(b, ob + j)))


@njit(nogil=True, cache=True, error_model="numpy")
def binary_rows_into(op, t, y, k, y_row, t_first):
    """t = t (op) y (t_first), else t = y (op) t: `binary_rows` with the output one operand's
    own buffer (given once: two arrays on one buffer would keep LLVM from vectorising). The
    operand order is chosen outside the loops: a select inside them stops vectorisation."""
    if k == 1 and y_row:                     # a scalar operand
        yv = load(y, 0)
        if t_first:
            for i in range(t.size):
                put(t, i, _binop(op, load(t, i), yv))
        else:
            for i in range(t.size):
                put(t, i, _binop(op, yv, load(t, i)))
        return
    for r in range(t.size // k):
        oy = 0 if y_row else r * k
        o = r * k
        if t_first:
            for j in range(k):
                put(t, o + j, _binop(op, load(t, o + j), load(y, oy + j)))
        else:
            for j in range(k):
                put(t, o + j, _binop(op, load(y, oy + j), load(t, o + j)))


@njit(nogil=True, cache=True, error_model="numpy")
def scatter_add_rows(out, idx, rows):
    """out[idx[k], :] += rows[k, :] for k = 0..N-1 in order (out (D, W), rows (N, W), one dtype):
    the sequential loop itself."""
    for k in range(idx.size):
        d = idx[k]
        for j in range(out.shape[1]):
            out[d, j] = out[d, j] + rows[k, j]


# --- row kernels: the row sums are NumPy's add-reduce of a contiguous row (pairwise summation) --
# (Loops index row slices from 0: numba's wrap-around of negative indices otherwise keeps LLVM
# from vectorising them.)
_ZERO = _F(0)


@njit(nogil=True, cache=True, error_model="numpy")
def _pairwise(a):
    """NumPy's pairwise sum of the contiguous row `a` (`pairwise_sum`: below 8 elements in
    order, up to 128 in 8 interleaved partial sums, above that two halves split at a multiple
    of 8), in float32 (a float16 row as its float32 values)."""
    n = a.size
    if n < 8:
        res = _ZERO
        for i in range(n):
            res = res + load(a, i)
        return res
    if n <= 128:
        r0, r1, r2, r3 = load(a, 0), load(a, 1), load(a, 2), load(a, 3)
        r4, r5, r6, r7 = load(a, 4), load(a, 5), load(a, 6), load(a, 7)
        m = n - n % 8
        for k in range(1, m // 8):
            j = 8 * k
            r0 = r0 + load(a, j)
            r1 = r1 + load(a, j + 1)
            r2 = r2 + load(a, j + 2)
            r3 = r3 + load(a, j + 3)
            r4 = r4 + load(a, j + 4)
            r5 = r5 + load(a, j + 5)
            r6 = r6 + load(a, j + 6)
            r7 = r7 + load(a, j + 7)
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(m, n):
            res = res + load(a, i)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a[:n2]) + _pairwise(a[n2:])


@njit(nogil=True, cache=True, error_model="numpy")
def row_sum(a):
    """`np.add.reduce` of a contiguous float32 row into a float32 output: 0 + the pairwise
    sum."""
    return _ZERO + _pairwise(a)


@njit(nogil=True, cache=True, error_model="numpy")
def _row_mean(a):
    """`_mean_rows` of nn.py: the row sum divided by the count in float64, rounded."""
    return _F(np.float64(row_sum(a)) / np.float64(a.size))


@njit(nogil=True, cache=True, error_model="numpy")
def layer_norm_rows(x, w, b, eps, xc, sq, y, mean, inv):
    """LayerNorm of the rows of x (rows * c, flat; w, b (c,); xc and sq float32 scratch of x's
    size, sq may be y when y is float32): the passes of nn.py's `_layer_norm_fused` (mean,
    x - mean, (x - mean)**2, its mean, + eps, sqrt, 1 / ., * , * w, + b) row by row. x and y may
    be float16."""
    c = w.size
    for r in range(mean.size):
        xr = x[r * c:(r + 1) * c]
        cr = xc[r * c:(r + 1) * c]
        sr = sq[r * c:(r + 1) * c]
        yr = y[r * c:(r + 1) * c]
        m = _row_mean(xr)
        for i in range(c):
            d = load(xr, i) - m
            cr[i] = d
            sr[i] = d * d
        v = _row_mean(sr)
        v = v + eps
        v = _F(math.sqrt(v))
        v = _ONE / v
        for i in range(c):
            put(yr, i, ((cr[i] * v) * w[i]) + b[i])
        mean[r] = m
        inv[r] = v


@njit(nogil=True, cache=True, error_model="numpy")
def layer_norm_grad_rows(dy, x, w, mean, inv, prod, dxh, t, dx):
    """dx of LayerNorm and dy * xhat (into `prod`, summed for dweight by the caller), rows of
    (rows * c, flat) arrays, the passes of nn.py's `_layer_norm_grad_fused`; dxh and t float32
    scratch (t may be dx when dx is float32). x and dx may be float16 (read and rounded here),
    the others are float32."""
    c = w.size
    for r in range(mean.size):
        xr = x[r * c:(r + 1) * c]
        gr = dy[r * c:(r + 1) * c]
        pr = prod[r * c:(r + 1) * c]
        hr = dxh[r * c:(r + 1) * c]
        tr = t[r * c:(r + 1) * c]
        dr = dx[r * c:(r + 1) * c]
        m = mean[r]
        ib = inv[r]
        for i in range(c):
            xh = (load(xr, i) - m) * ib
            pr[i] = gr[i] * xh
            hr[i] = gr[i] * w[i]
        s = _row_mean(hr)
        for i in range(c):
            tr[i] = hr[i] * ((load(xr, i) - m) * ib)
        s2 = _row_mean(tr)
        for i in range(c):
            put(dr, i, ((hr[i] - s) - ((load(xr, i) - m) * ib) * s2) * ib)


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_shift_rows(x, e, c):
    """e = x - max(row) for the rows of c elements of flat x. The max is exact, so taking it in
    16 lanes (every 16th element each, then the lanes; vectorised) gives the row's max, as any
    order does. A NaN in a row is skipped by this max (NumPy's propagates it), but then reaches
    the row's sum, and the division by that sum makes the whole row NaN as NumPy's softmax does
    (the same bits, unless one row holds NaNs of different payloads: then the payload may be
    another of them)."""
    lanes = np.empty(_LANES, np.float32)
    body = c - c % _LANES
    for lo in range(0, x.size, c):
        xr = x[lo:lo + c]
        er = e[lo:lo + c]
        m = load(xr, 0)
        if body:
            for j in range(_LANES):
                lanes[j] = load(xr, j)
            for i in range(_LANES, body, _LANES):
                for j in range(_LANES):
                    v = load(xr, i + j)
                    lanes[j] = v if v > lanes[j] else lanes[j]
            m = lanes[0]
            for j in range(1, _LANES):
                v = lanes[j]
                m = v if v > m else m
        for i in range(body, c):
            v = load(xr, i)
            m = v if v > m else m
        for i in range(c):
            er[i] = load(xr, i) - m


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_scale_rows(e, c):
    """e /= sum(row) for the rows of c elements of flat e."""
    for lo in range(0, e.size, c):
        er = e[lo:lo + c]
        s = row_sum(er)
        for i in range(c):
            er[i] = er[i] / s


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_scale_rows_to(e, out, c):
    """out = e / sum(row) for the rows of c elements of flat float32 e (out: another array,
    float16 rounded once)."""
    for lo in range(0, e.size, c):
        er = e[lo:lo + c]
        orow = out[lo:lo + c]
        s = row_sum(er)
        for i in range(c):
            put(orow, i, er[i] / s)


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_grad_rows(dy, y, g, c):
    """g = dy * y - y * sum(dy * y) over the rows of c elements of the flat arrays."""
    for lo in range(0, y.size, c):
        dr = dy[lo:lo + c]
        yr = y[lo:lo + c]
        gr = g[lo:lo + c]
        for i in range(c):
            gr[i] = dr[i] * yr[i]
        s = row_sum(gr)
        for i in range(c):
            gr[i] = gr[i] - yr[i] * s


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_grad_rows_to(dy, y, t, g, c):
    """softmax_grad_rows with the float32 products dy * y in `t` (c elements), for a g that
    cannot hold them (float16: rounded once); g may be dy's own buffer."""
    for lo in range(0, y.size, c):
        dr = dy[lo:lo + c]
        yr = y[lo:lo + c]
        gr = g[lo:lo + c]
        for i in range(c):
            t[i] = load(dr, i) * load(yr, i)
        s = row_sum(t)
        for i in range(c):
            put(gr, i, t[i] - load(yr, i) * s)
