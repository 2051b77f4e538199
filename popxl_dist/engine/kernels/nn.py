"""Kernels: GroupNormalization (+Grad), BatchNormalization (+Grad), Nll (+Grad).

float16 inputs are computed in float32 (statistics and reductions too) and rounded once.
"""
from __future__ import annotations

import numpy as np

from ._blocks import as_f32, f32_work, row_blocks, store
from ._util import F16, F32, from_f16, jit_loops, np_dtype, scratch, to_f16, without_out
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
        for r0, r1 in row_blocks(n, c):
            rows = r1 - r0
            xb = as_f32(x[r0:r1], "ln_x")
            m = scratch("ln_m", rows).reshape(rows, 1)
            v = scratch("ln_v", rows).reshape(rows, 1)
            xc = scratch("ln_xc", xb.size).reshape(xb.shape)
            yb = f32_work(y[r0:r1], "ln_y", xb.size)
            jit = jit_loops() if xb.size >= 4096 and yb.flags.c_contiguous else None
            if jit is not None:                  # the same passes, row by row, compiled
                jit.layer_norm_rows(xb.reshape(-1), w32.reshape(-1), b32.reshape(-1), eps,
                                    xc.reshape(-1), yb.reshape(-1), m.reshape(-1),
                                    v.reshape(-1))
                store(yb, y[r0:r1])
                store(m.reshape(-1), mean[r0:r1])
                store(v.reshape(-1), inv[r0:r1])
                continue
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
        for r0, r1 in row_blocks(n, c):
            rows = r1 - r0
            xb = as_f32(x[r0:r1], "ln_x")
            mb = as_f32(mean[r0:r1], "ln_mb").reshape(rows, 1)
            ib = as_f32(inv[r0:r1], "ln_ib").reshape(rows, 1)
            dyb = dy32[r0:r1]
            dxh = scratch("ln_sq", xb.size).reshape(xb.shape)
            dxb = f32_work(dx[r0:r1], "ln_y", xb.size)
            jit = jit_loops() if xb.size >= 4096 and dxb.flags.c_contiguous else None
            if jit is not None:                  # the same passes, row by row, compiled
                jit.layer_norm_grad_rows(dyb.reshape(-1), xb.reshape(-1), w32.reshape(-1),
                                         np.ascontiguousarray(mb).reshape(-1),
                                         np.ascontiguousarray(ib).reshape(-1),
                                         prod[r0:r1].reshape(-1), dxh.reshape(-1),
                                         dxb.reshape(-1))
                store(dxb, dx[r0:r1])
                continue
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
        dw = np.sum(prod, axis=(0,))
        db = np.sum(dy32, axis=(0,))
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
        y = x.astype(calc) - mean.astype(calc).reshape(cs)
        y *= k.reshape(cs)
        y += bias.astype(calc).reshape(cs)
        return y.astype(dt, copy=False)
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


# --- convolution and pooling (im2col over kernel offsets) -----------------------------------

class _Windows:
    """Static geometry of a strided, dilated, padded window sweep over the spatial dims."""

    def __init__(self, in_shape, kernel, strides, pads, dilations, out_sp):
        n = len(kernel)
        self.in_shape = tuple(in_shape)
        self.begins = tuple(pads[:n])
        sp = in_shape[2:]
        # ends grow if ceil_mode windows run past the given padding
        self.ends = tuple(max(pads[n + d], (out_sp[d] - 1) * strides[d]
                              + (kernel[d] - 1) * dilations[d] + 1 - sp[d] - pads[d])
                          for d in range(n))
        self.padded = tuple(s + b + e for s, b, e in zip(sp, self.begins, self.ends))
        self.out_sp = tuple(out_sp)
        self.nk = int(np.prod(kernel))
        self.slices = [tuple(slice(k * dl, k * dl + st * (o - 1) + 1, st)
                             for k, dl, st, o in zip(off, dilations, strides, out_sp))
                       for off in np.ndindex(*kernel)]
        self.crop = tuple(slice(b, b + s) for b, s in zip(self.begins, sp))

    def pad(self, x: np.ndarray, value=0) -> np.ndarray:
        if not any(self.begins) and not any(self.ends):
            return x
        width = [(0, 0)] * (x.ndim - len(self.begins)) + list(zip(self.begins, self.ends))
        return np.pad(x, width, constant_values=value)

    def cols(self, xp: np.ndarray, lead: int) -> np.ndarray:
        """(*lead dims, K, *out_sp): the window cells of every output position."""
        pre = (slice(None),) * lead
        return np.stack([xp[pre + sl] for sl in self.slices], axis=lead)

    def fold(self, dcols: np.ndarray, lead: int) -> np.ndarray:
        """Adjoint of `cols` followed by cropping the padding."""
        out = np.zeros(dcols.shape[:lead] + self.padded, dtype=dcols.dtype)
        pre = (slice(None),) * lead
        for i, sl in enumerate(self.slices):
            out[pre + sl] += dcols[pre + (i,)]
        return out[pre + self.crop]


def _conv_geometry(attrs, x_shape, w_shape, out_sp):
    return _Windows(x_shape, w_shape[2:], attrs["strides"], attrs["pads"], attrs["dilations"],
                    out_sp)


def _conv_cols(win, x, g, calc):
    n, c = x.shape[:2]
    xp = win.pad(x.astype(calc, copy=False)).reshape((n, g, c // g) + win.padded)
    cols = win.cols(xp, 3)                                    # (N, g, C/g, K, *O)
    return cols.reshape(n, g, (c // g) * win.nk, -1)          # (N, g, C/g*K, P)


def _conv_fn(attrs, x_shape, w_shape, out_shape, calc):
    """fn(x, w) -> conv in `calc` (not rounded to the output dtype)."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, out_shape[2:])
    m = w_shape[0]

    def run(x, w):
        cols = _conv_cols(win, x, g, calc)
        wg = w.astype(calc, copy=False).reshape(g, m // g, -1)
        return np.matmul(wg, cols).reshape(out_shape)
    return run


def _conv_data_grad_fn(attrs, dy_shape, w_shape, x_shape, calc):
    """fn(dy, w) -> the conv's input gradient of shape `x_shape` in `calc` (also ConvTranspose:
    the transpose of a conv whose input is the output)."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, dy_shape[2:])
    n, c, m = x_shape[0], x_shape[1], w_shape[0]

    def run(dy, w):
        wg = w.astype(calc, copy=False).reshape(g, m // g, -1)
        dyg = dy.astype(calc, copy=False).reshape(n, g, m // g, -1)
        dcols = np.matmul(wg.transpose(0, 2, 1), dyg)          # (N, g, C/g*K, P)
        dcols = dcols.reshape((n, g, c // g, win.nk) + win.out_sp)
        return win.fold(dcols, 3).reshape(x_shape)
    return run


def _conv_weights_grad_fn(attrs, dy_shape, x_shape, w_shape, calc):
    """fn(dy, x) -> the conv's weight gradient in `calc`."""
    g = int(attrs["group"])
    win = _conv_geometry(attrs, x_shape, w_shape, dy_shape[2:])
    n, m = x_shape[0], w_shape[0]

    def run(dy, x):
        cols = _conv_cols(win, x, g, calc)
        dyg = dy.astype(calc, copy=False).reshape(n, g, m // g, -1)
        dw = np.matmul(dyg, cols.transpose(0, 1, 3, 2)).sum(axis=0)
        return dw.reshape(w_shape)
    return run


def _conv_family(op_type: str, make_fn, doc: str):
    """Register the kernel of a conv-family op: `make_fn(attrs, in0 shape, in1 shape, out
    shape, calc)` in float32 for float16 (rounded once); float8 operands with a log2_scale
    third input are decoded, run in float32 and scaled by 2^log2_scale before rounding."""

    def factory(attrs, ins, outs):
        dt = np_dtype(outs[0])
        fn = make_fn(attrs, ins[0].shape, ins[1].shape, outs[0].shape, _calc(dt))
        if len(ins) == 3:
            from .float8 import pow2scaled

            return pow2scaled(fn, ins, outs, op_type)
        return lambda a, b: fn(a, b).astype(dt, copy=False)

    factory.__doc__ = doc
    kernel(op_type)(factory)


_conv_family("Conv", _conv_fn, "ins (x, w[, log2_scale]) -> y.")
_conv_family("ConvTranspose", _conv_data_grad_fn,
             "ins (x (N, C, *in), w (C, M/group, *k)[, log2_scale]) -> y (N, M, *out): the "
             "input gradient of the conv (N, M, *out) -> (N, C, *in) with weight w.")
_conv_family("ConvDataGrad", _conv_data_grad_fn, "ins (dy, w) -> dx.")
_conv_family("ConvWeightsGrad", _conv_weights_grad_fn, "ins (dy, x) -> dw.")


class _Pooling:
    """A pool op's geometry: the input dilated by `in_dilations` (inserted zero cells), the
    window sweep over it, and the output padded by `out_pads` (zeros)."""

    def __init__(self, attrs, x_shape, y_shape):
        n = len(x_shape) - 2
        self.in_dil = tuple(attrs.get("in_dilations") or (1,) * n)
        op = tuple(attrs.get("out_pads") or (0,) * (2 * n))
        self.dilated = tuple(x_shape[:2]) + tuple(
            d * (s - 1) + 1 for d, s in zip(self.in_dil, x_shape[2:]))
        self.keep = tuple(slice(None, None, d) for d in self.in_dil)
        inner = tuple(o - op[i] - op[n + i] for i, o in enumerate(y_shape[2:]))
        self.out_width = [(0, 0), (0, 0)] + [(op[i], op[n + i]) for i in range(n)]
        self.out_crop = tuple(slice(op[i], op[i] + inner[i]) for i in range(n))
        self.padded_out = any(op)
        self.win = _Windows(self.dilated, attrs["kernel_shape"], attrs["strides"],
                            attrs["pads"], attrs["dilations"], inner)

    def dilate(self, x: np.ndarray) -> np.ndarray:
        if x.shape == self.dilated:
            return x
        out = np.zeros(self.dilated, dtype=x.dtype)
        out[(slice(None), slice(None)) + self.keep] = x
        return out

    def undilate(self, dx: np.ndarray) -> np.ndarray:
        return dx[(slice(None), slice(None)) + self.keep]

    def pad_out(self, y: np.ndarray) -> np.ndarray:
        return np.pad(y, self.out_width) if self.padded_out else y

    def crop_out(self, dy: np.ndarray) -> np.ndarray:
        return dy[(slice(None), slice(None)) + self.out_crop] if self.padded_out else dy


def _avg_counts(win, calc):
    ones = win.pad(np.ones((1, 1) + win.in_shape[2:], dtype=calc))
    return win.cols(ones, 2).sum(axis=2)                       # (1, 1, *O) real cells


@kernel("AveragePool")
def _avg_pool_kernel(attrs, ins, outs):
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, ins[0].shape, outs[0].shape)
    win = pool.win
    counts = _avg_counts(win, calc)

    def run(x):
        s = win.cols(win.pad(pool.dilate(x.astype(calc, copy=False))), 2).sum(axis=2)
        return pool.pad_out(s / counts).astype(dt, copy=False)
    return run


@kernel("AveragePoolGrad")
def _avg_pool_grad_kernel(attrs, ins, outs):
    """ins (dy, x) -> dx."""
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, outs[0].shape, ins[0].shape)
    win = pool.win
    counts = _avg_counts(win, calc)

    def run(dy, x):
        share = pool.crop_out(dy).astype(calc) / counts
        dcols = np.broadcast_to(share[:, :, None], share.shape[:2] + (win.nk,) + win.out_sp)
        return pool.undilate(win.fold(dcols, 2)).astype(dt, copy=False)
    return run


@kernel("MaxPool")
def _max_pool_kernel(attrs, ins, outs):
    dt = np_dtype(outs[0])
    pool = _Pooling(attrs, ins[0].shape, outs[0].shape)
    win = pool.win

    def run(x):
        y = win.cols(win.pad(pool.dilate(x), -np.inf), 2).max(axis=2)
        return pool.pad_out(y).astype(dt, copy=False)
    return run


@kernel("MaxPoolGrad")
def _max_pool_grad_kernel(attrs, ins, outs):
    """ins (dy, x) -> dx: each output's gradient goes to its (first) maximal input cell."""
    dt = np_dtype(outs[0])
    calc = _calc(dt)
    pool = _Pooling(attrs, outs[0].shape, ins[0].shape)
    win = pool.win

    def run(dy, x):
        cols = win.cols(win.pad(pool.dilate(x), -np.inf), 2)
        arg = cols.argmax(axis=2)
        onehot = np.arange(win.nk).reshape((1, 1, win.nk) + (1,) * len(win.out_sp)) \
            == arg[:, :, None]
        dcols = onehot * pool.crop_out(dy).astype(calc)[:, :, None]
        return pool.undilate(win.fold(dcols, 2)).astype(dt, copy=False)
    return run
