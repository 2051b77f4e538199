"""Kernels: GroupNormalization (+Grad), BatchNormalization (+Grad), Nll (+Grad) and the fused
NLL + softmax gradient NlllWithSoftmaxGradDirect.

float16 inputs are computed in float32 (statistics and reductions too) and rounded once.
"""
from __future__ import annotations

import numpy as np

from ._blocks import as_f32, column_sums, each_range, f32_work, row_blocks, store
from ._util import (F16, F32, as_dtype, f16_into, jit_loops, jit_view, np_dtype, scratch, to_f16,
                    without_out)
from .registry import kernel

__all__: list = []   # registrations only

_NLL_EPS = {F16: np.float32(6.104e-5)}
_NLL_EPS_DEFAULT = 1e-7


def _calc(dt: np.dtype) -> np.dtype:
    return F32 if dt == F16 else dt


def _chan_shape(shape):
    """Shape that broadcasts a (C,) vector over channel axis 1 of `shape`."""
    return (1, shape[1]) + (1,) * (len(shape) - 2)


def _rows_norm(ins, outs, g: int) -> bool:
    """Whether a group norm is a norm of rows with per-column weights: a 2-D (N, C) input in one
    group (layer norm), float32 or float16 throughout (the fused kernels' case)."""
    return (g == 1 and len(ins[0].shape) == 2
            and all(np_dtype(i) in (F16, F32) for i in ins) and np_dtype(ins[0]) == np_dtype(outs[0])
            and all(np_dtype(o) == np_dtype(outs[0]) for o in outs))


def _mean_rows(a: np.ndarray, out: np.ndarray) -> None:
    """Row means of a 2-D block into `out` (rows, 1), exactly as `np.mean(a3, axis=2)` of the
    (rows, 1, C) view computes them (NumPy's `_mean`: an add-reduce, then a division by the
    count as an `intp`, in float64, rounded) without its per-call overhead."""
    rows, c = a.shape
    o3 = out.reshape(rows, 1, 1)
    np.add.reduce(a.reshape(rows, 1, c), axis=2, keepdims=True, out=o3)
    np.true_divide(o3, np.intp(c), out=o3, casting="unsafe")


@kernel("GroupNormalization", writes_out=True)
def _group_norm_kernel(attrs, ins, outs):
    g = int(attrs["num_groups"])
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    eps = calc.type(attrs["epsilon"])
    shape = ins[0].shape
    n = shape[0]
    cs = _chan_shape(shape)
    if _rows_norm(ins, outs, g):
        return _layer_norm_fused(shape, dt, eps)

    @without_out
    def run(x, w, b):
        xg = x.reshape(n, g, -1).astype(calc)
        mean = xg.mean(axis=2, keepdims=True)
        xc = xg - mean
        var = np.mean(xc * xc, axis=2, keepdims=True)
        inv = 1 / np.sqrt(var + eps)
        y = (xc * inv).reshape(shape)
        y *= w.astype(calc).reshape(cs)
        y += b.astype(calc).reshape(cs)
        return (y.astype(dt, copy=False), mean.reshape(-1).astype(dt),
                inv.reshape(-1).astype(dt))
    return run


def _layer_norm_fused(shape, dt: np.dtype, eps):
    """GroupNormalization of (N, C) rows in one group, row blocks at a time: the arithmetic of
    the general kernel below, in the same order, on the same float32 values."""
    n, c = shape

    def run(x, w, b, out=None):
        y = np.empty(shape, dt) if out is None or out[0] is None else out[0]
        mean = np.empty(n, dt) if out is None or out[1] is None else out[1]
        inv = np.empty(n, dt) if out is None or out[2] is None else out[2]
        x = np.ascontiguousarray(x)
        w32 = as_f32(w, "ln_w").reshape(1, c)
        b32 = as_f32(b, "ln_b").reshape(1, c)
        # float16 x and y go to the compiled loops as they are (read and rounded there)
        direct = x.dtype == F16 and dt == F16 and y.flags.c_contiguous

        def block(r0: int, r1: int) -> None:
            rows = r1 - r0
            size = rows * c
            m = scratch("ln_m", rows).reshape(rows, 1)
            v = scratch("ln_v", rows).reshape(rows, 1)
            xc = scratch("ln_xc", size)
            jit = jit_loops() if size > 0 else None
            if jit is not None and direct:
                jit.layer_norm_rows(jit_view(x[r0:r1]).reshape(-1), w32.reshape(-1),
                                    b32.reshape(-1), eps, xc, scratch("ln_sq", size),
                                    jit_view(y[r0:r1]).reshape(-1), m.reshape(-1),
                                    v.reshape(-1))
                store(m.reshape(-1), mean[r0:r1])
                store(v.reshape(-1), inv[r0:r1])
                return
            xb = as_f32(x[r0:r1], "ln_x")
            xc = xc.reshape(xb.shape)
            yb = f32_work(y[r0:r1], "ln_y", xb.size)
            if jit is not None and yb.flags.c_contiguous:    # the same passes, row by row
                yf = yb.reshape(-1)
                jit.layer_norm_rows(xb.reshape(-1), w32.reshape(-1), b32.reshape(-1), eps,
                                    xc.reshape(-1), yf, yf, m.reshape(-1), v.reshape(-1))
                store(yb, y[r0:r1])
                store(m.reshape(-1), mean[r0:r1])
                store(v.reshape(-1), inv[r0:r1])
                return
            sq = scratch("ln_sq", xb.size).reshape(xb.shape)
            _mean_rows(xb, m)
            np.subtract(xb, m, out=xc)
            np.multiply(xc, xc, out=sq)
            _mean_rows(sq, v)
            v += eps
            np.sqrt(v, out=v)
            np.divide(1, v, out=v)
            np.multiply(xc, v, out=yb)
            yb *= w32
            yb += b32
            store(yb, y[r0:r1])
            store(m.reshape(-1), mean[r0:r1])
            store(v.reshape(-1), inv[r0:r1])
        each_range(row_blocks(n, c), block)
        return y, mean, inv
    return run


def _layer_norm_grad_fused(shape, dt: np.dtype, out_dts):
    """GroupNormalizationGrad of (N, C) rows in one group, in row blocks (dx) and over the whole
    product array (dweight, dbias: the same column sums as the general kernel)."""
    n, c = shape

    def run(dy, x, w, mean, inv, out=None):
        dx = np.empty(shape, dt) if out is None or out[0] is None else out[0]
        dy = np.ascontiguousarray(dy)
        x = np.ascontiguousarray(x)
        w32 = as_f32(w, "ln_w").reshape(1, c)
        dy32 = as_f32(dy, "lng_dy_full")                 # whole: db sums its columns
        prod = scratch("lng_prod", n * c).reshape(n, c)   # dy * xhat, whole: dw sums it

        direct = x.dtype == F16 and dt == F16 and dx.flags.c_contiguous

        def block(r0: int, r1: int) -> None:
            rows = r1 - r0
            size = rows * c
            mb = as_f32(mean[r0:r1], "ln_mb").reshape(rows, 1)
            ib = as_f32(inv[r0:r1], "ln_ib").reshape(rows, 1)
            dyb = dy32[r0:r1]
            jit = jit_loops() if size > 0 else None
            if jit is not None and direct:      # float16 x and dx read and rounded in the loops
                jit.layer_norm_grad_rows(dyb.reshape(-1), jit_view(x[r0:r1]).reshape(-1),
                                         w32.reshape(-1), np.ascontiguousarray(mb).reshape(-1),
                                         np.ascontiguousarray(ib).reshape(-1),
                                         prod[r0:r1].reshape(-1), scratch("ln_sq", size),
                                         scratch("lng_t", size), jit_view(dx[r0:r1]).reshape(-1))
                return
            xb = as_f32(x[r0:r1], "ln_x")
            dxh = scratch("ln_sq", xb.size).reshape(xb.shape)
            dxb = f32_work(dx[r0:r1], "ln_y", xb.size)
            if jit is not None and dxb.flags.c_contiguous:   # the same passes, row by row
                df = dxb.reshape(-1)
                jit.layer_norm_grad_rows(dyb.reshape(-1), xb.reshape(-1), w32.reshape(-1),
                                         np.ascontiguousarray(mb).reshape(-1),
                                         np.ascontiguousarray(ib).reshape(-1),
                                         prod[r0:r1].reshape(-1), dxh.reshape(-1), df, df)
                store(dxb, dx[r0:r1])
                return
            xh = scratch("ln_xc", xb.size).reshape(xb.shape)
            t = scratch("lng_t", xb.size).reshape(xb.shape)
            s = scratch("ln_m", rows).reshape(rows, 1)
            np.subtract(xb, mb, out=xh)
            xh *= ib
            np.multiply(dyb, xh, out=prod[r0:r1])
            np.multiply(dyb, w32, out=dxh)
            _mean_rows(dxh, s)
            np.subtract(dxh, s, out=dxb)
            np.multiply(dxh, xh, out=t)
            _mean_rows(t, s)
            np.multiply(xh, s, out=t)
            dxb -= t
            dxb *= ib
            store(dxb, dx[r0:r1])
        each_range(row_blocks(n, c), block)
        dw = column_sums(prod, np.empty(c, F32))
        db = column_sums(dy32.reshape(n, c), np.empty(c, F32))
        return (dx, _into(dw, out_dts[0], None if out is None else out[1]),
                _into(db, out_dts[1], None if out is None else out[2]))
    return run


def _into(r: np.ndarray, dt: np.dtype, out) -> np.ndarray:
    """`r.astype(dt)` (a new array), or written into `out`."""
    if out is None:
        return to_f16(r) if dt == F16 else r.astype(dt)
    store(r, out)
    return out


@kernel("GroupNormalizationGrad", writes_out=True)
def _group_norm_grad_kernel(attrs, ins, outs):
    """ins (dy, x, weight, mean, inv_std) -> (dx, dweight, dbias)."""
    g = int(attrs["num_groups"])
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    shape = ins[1].shape
    n = shape[0]
    cs = _chan_shape(shape)
    red = (0,) + tuple(range(2, len(shape)))
    if _rows_norm(ins[1:], outs, g) and np_dtype(ins[0]) == dt:
        return _layer_norm_grad_fused(shape, dt, (np_dtype(outs[1]), np_dtype(outs[2])))

    @without_out
    def run(dy, x, w, mean, inv):
        dyc = dy.astype(calc)
        inv_g = inv.astype(calc).reshape(n, g, 1)
        xhat = ((x.reshape(n, g, -1).astype(calc) - mean.astype(calc).reshape(n, g, 1))
                * inv_g).reshape(shape)
        dw = np.sum(dyc * xhat, axis=red)
        db = np.sum(dyc, axis=red)
        dxhat = (dyc * w.astype(calc).reshape(cs)).reshape(n, g, -1)
        xh = xhat.reshape(n, g, -1)
        dx = dxhat - dxhat.mean(axis=2, keepdims=True)
        dx -= xh * np.mean(dxhat * xh, axis=2, keepdims=True)
        dx *= inv_g
        return (dx.reshape(shape).astype(dt, copy=False), dw.astype(np_dtype(outs[1])),
                db.astype(np_dtype(outs[2])))
    return run


@kernel("BatchNormalization")
def _batch_norm_kernel(attrs, ins, outs):
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    eps = calc.type(attrs["epsilon"])
    cs = _chan_shape(ins[0].shape)

    def run(x, scale, bias, mean, var):
        k = scale.astype(calc) / np.sqrt(var.astype(calc) + eps)
        y = as_dtype(x, calc) - mean.astype(calc).reshape(cs)
        y *= k.reshape(cs)
        y += bias.astype(calc).reshape(cs)
        return as_dtype(y, dt)
    return run


@kernel("BatchNormalizationGrad")
def _batch_norm_grad_kernel(attrs, ins, outs):
    """ins (dy, x, scale, mean, var) -> (dx, dscale, dbias, dmean, dvar)."""
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    eps = calc.type(attrs["epsilon"])
    shape = ins[1].shape
    cs = _chan_shape(shape)
    red = (0,) + tuple(range(2, len(shape)))
    pdt = np_dtype(outs[1])

    def run(dy, x, scale, mean, var):
        dyc = dy.astype(calc)
        s = scale.astype(calc)
        inv = 1 / np.sqrt(var.astype(calc) + eps)
        xc = x.astype(calc) - mean.astype(calc).reshape(cs)
        sum_dy = np.sum(dyc, axis=red)
        sum_dy_xc = np.sum(dyc * xc, axis=red)
        dx = dyc * (s * inv).reshape(cs)
        dscale = sum_dy_xc * inv
        dmean = -sum_dy * s * inv
        dvar = sum_dy_xc * s * (-0.5) * inv ** 3
        return (dx.astype(dt, copy=False), dscale.astype(pdt), sum_dy.astype(pdt),
                dmean.astype(pdt), dvar.astype(pdt))
    return run


def _nll_setup(attrs, probs_info, labels_info):
    ignore = attrs.get("ignore_index")
    reduction = attrs["reduction"]
    log_prob = attrs["log_prob"]
    pdt = np_dtype(probs_info)
    calc = _calc(pdt)
    eps = calc.type(_NLL_EPS.get(pdt, _NLL_EPS_DEFAULT))
    n_classes = probs_info.shape[-1]

    def pick(probs, labels):
        """(rows, safe labels, valid mask or None, count) of the flattened problem."""
        lab = labels.reshape(-1).astype(np.int64, copy=False)
        valid = None if ignore is None else lab != ignore
        safe = lab if valid is None else np.where(valid, lab, 0)
        if safe.size and (safe.min() < 0 or safe.max() >= n_classes):
            raise IndexError(f"Nll: a label is out of range [0, {n_classes})")
        count = lab.shape[0] if valid is None else int(valid.sum())
        return np.arange(lab.shape[0]), safe, valid, max(count, 1)

    return ignore, reduction, log_prob, pdt, calc, eps, n_classes, pick


@kernel("Nll")
def _nll_kernel(attrs, ins, outs):
    _, reduction, log_prob, pdt, calc, eps, n_classes, pick = _nll_setup(attrs, ins[0], ins[1])
    out_dt = np_dtype(outs[0])
    loss_shape = outs[0].shape

    def run(probs, labels):
        p = probs.reshape(-1, n_classes)
        rows, safe, valid, count = pick(probs, labels)
        picked = p[rows, safe].astype(calc)
        loss = -picked if log_prob else -np.log(np.maximum(picked, eps))
        if valid is not None:
            loss = np.where(valid, loss, calc.type(0))
        if reduction == "none":
            return loss.reshape(loss_shape).astype(out_dt)
        total = loss.sum(dtype=calc)
        if reduction == "mean":
            total = total / calc.type(count)
        return np.asarray(total, dtype=out_dt)
    return run


@kernel("NllGrad")
def _nll_grad_kernel(attrs, ins, outs):
    """ins (dloss, probs, labels) -> dprobs."""
    _, reduction, log_prob, pdt, calc, eps, n_classes, pick = _nll_setup(attrs, ins[1], ins[2])
    out_dt = np_dtype(outs[0])

    def run(dloss, probs, labels):
        p = probs.reshape(-1, n_classes)
        rows, safe, valid, count = pick(probs, labels)
        if reduction == "none":
            g = dloss.reshape(-1).astype(calc)
        else:
            g = np.full(rows.shape, np.asarray(dloss, dtype=calc).reshape(()), dtype=calc)
            if reduction == "mean":
                g /= calc.type(count)
        if log_prob:
            d = -g
        else:
            picked = p[rows, safe].astype(calc)
            above = picked > eps            # below eps the max() clamps: zero gradient
            d = np.where(above, -g / np.where(above, picked, 1), calc.type(0))
        if valid is not None:
            d = np.where(valid, d, calc.type(0))
        out = np.zeros(p.shape, dtype=calc)
        out[rows, safe] = d
        return out.reshape(probs.shape).astype(out_dt, copy=False)
    return run


@kernel("NlllWithSoftmaxGradDirect", writes_out=True)
def _nll_softmax_grad(attrs, ins, outs):
    ignore = attrs.get("ignore_index")
    reduction = attrs.get("reduction", "mean")
    loss_dt, dx_dt = np_dtype(outs[0]), np_dtype(outs[1])
    n_classes = ins[0].shape[-1]
    loss_shape = outs[0].shape
    dx_shape = outs[1].shape

    def run(probs, labels, loss_grad, out=None):
        p = probs.reshape(-1, n_classes)
        lab = labels.reshape(-1).astype(np.int64, copy=False)
        rows = np.arange(lab.shape[0])
        valid = None if ignore is None else (lab != ignore)
        safe = lab if valid is None else np.where(valid, lab, 0)
        # dx starts as the float32 probabilities: in the output itself when it is float32
        dx_out = None if out is None else out[1]
        in_out = dx_out is not None and dx_dt == F32 and dx_out.flags.c_contiguous
        if in_out:
            dx = dx_out.reshape(p.shape)
        elif dx_dt == F16 or out is not None:          # a float32 work array, rounded below
            dx = scratch("nll_dx", p.size).reshape(p.shape)
        else:
            dx = np.empty(p.shape, F32 if p.dtype == F16 else p.dtype)
        if valid is not None:
            count = max(int(valid.sum()), 1)
        else:
            count = max(lab.shape[0], 1)
        g = np.float32(np.asarray(loss_grad).reshape(()))
        scale = g / np.float32(count) if reduction == "mean" else g
        picked = np.empty(lab.shape[0], dx.dtype)

        def block(r0: int, r1: int) -> None:
            """Rows r0..r1 of dx: the probabilities, their labels' entries picked (for the
            loss) and lowered by 1, ignored rows zeroed, all scaled: row by row, the arithmetic
            of the whole-array definition."""
            d = dx[r0:r1]
            if p.dtype == F16:
                f16_into(p[r0:r1], d)
            else:
                np.copyto(d, p[r0:r1])
            r = rows[: r1 - r0]
            s = safe[r0:r1]
            picked[r0:r1] = d[r, s]
            d[r, s] -= 1
            if valid is not None:
                d[~valid[r0:r1]] = 0
            d *= scale
        each_range(row_blocks(p.shape[0], n_classes), block)
        loss = -np.log(picked + np.float32(1e-7))
        if valid is not None:
            loss = np.where(valid, loss, 0).astype(loss.dtype)
        if reduction == "mean":
            loss_out = np.asarray(np.float32(loss.sum(dtype=F32) / count), dtype=loss_dt)
        elif reduction == "sum":
            loss_out = np.asarray(loss.sum(dtype=F32), dtype=loss_dt)
        else:
            loss_out = loss.reshape(loss_shape).astype(loss_dt)
        if in_out:
            res = dx_out
        elif dx_out is not None:
            store(dx.reshape(dx_shape), dx_out)
            res = dx_out
        elif dx_dt == F16:
            res = to_f16(dx).reshape(dx_shape)
        else:
            res = dx.reshape(dx_shape).astype(dx_dt, copy=False)
        if out is not None and out[0] is not None:
            out[0][...] = loss_out
            loss_out = out[0]
        return loss_out, res
    return run
