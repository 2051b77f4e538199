"""Kernels: the var_updates family (Accumulate, AccumulatorScale, SparseAccumulate, CopyVarUpdate,
the Adam/Lamb/AdaMax updaters and AdamVarUpdate). All write into input 0 in place, except the
updaters, which return a new array and increment their step input (the last input) in place.

Numerics (mixed precision as on the IPU): `X` is rounded into `t`'s dtype first; the scalar
coefficients are computed in float32 (the optimizer value's type); the update is computed in
float32 for float16 accumulators and rounded once into `t`. Integer accumulators: a plain add is
exact integer arithmetic; scaled updates are computed in float64 and truncated toward zero.
"""
from __future__ import annotations

import numpy as np

from ._blocks import each_range, shared
from ._scatter_add import scatter_add_rows
from ._util import (F16, F32, blocks, cast, f16_into, flat, jit_loops, jit_view, np_dtype,
                    round_f16, scalar, scratch, to_f16)
from .registry import kernel

__all__: list = []   # registrations only

_MOVING = ("moving_average", "moving_average_square")


F64 = np.dtype(np.float64)


def _calc_dtypes(t_dt: np.dtype):
    """(coefficient dtype, compute dtype) for an accumulator of dtype `t_dt`."""
    if t_dt == F16:
        return F32, F32
    if t_dt == F32:
        return F32, F32
    if t_dt.kind in "iu":
        return F64, F64        # exact for 32-bit integers; stored back with truncation
    return t_dt, t_dt


def _accumulate_coeffs(mode: str, f, cdt):
    """(a, b) with the update t = a*t + b*X' (a None: a == 1)."""
    one = cdt.type(1)
    if mode == "add":
        return None, one
    f = cdt.type(f)
    if mode in ("dampened_add", "dampened_add_square"):
        return None, f
    if mode == "mean":
        return f / (f + one), one / (f + one)
    if mode in _MOVING:
        return f, one - f
    raise ValueError(f"Accumulate: unknown mode {mode!r}")


def _rounder(x_dt: np.dtype, t_dt: np.dtype, calc: np.dtype):
    """X as a new `calc` array, rounded into `t`'s dtype first."""
    if t_dt == F16 and x_dt == F32 and calc == F32:
        return round_f16                         # one pass instead of two conversions
    if x_dt == t_dt:
        return lambda x: cast(x, calc)
    return lambda x: cast(cast(x, t_dt), calc)


@kernel("Accumulate", modifies=(0,))
def _accumulate_kernel(attrs, ins, outs):
    mode = attrs["mode"]
    square = mode in ("dampened_add_square", "moving_average_square")
    t_dt = np_dtype(ins[0])
    cdt, calc = _calc_dtypes(t_dt)
    f_tensor = attrs.get("f_tensor", False)
    const = None if f_tensor else _accumulate_coeffs(mode, attrs.get("f"), cdt)
    x_dt = np_dtype(ins[1])

    if mode == "add" and (calc == t_dt or t_dt.kind in "iu"):
        if x_dt == t_dt:
            def add_same(t, x):
                np.add(t, x, out=t)
                return t
            return add_same

        def add_mixed(t, x):
            np.add(t, x.astype(t_dt), out=t)
            return t
        return add_mixed

    x_to_calc = _rounder(x_dt, t_dt, calc)

    def update(tv, x, a, b):
        """The new value of `tv` (in calc) from `x` (any dtype)."""
        xv = x_to_calc(x)
        if square:
            xv *= xv
        if b != 1:
            xv *= b
        if a is None:
            xv += tv
            return xv
        r = tv * a
        r += xv
        return r

    def run(t, x, *extra):
        a, b = const if const is not None else _accumulate_coeffs(
            mode, scalar(extra[0], cdt), cdt)
        if t_dt == F16 and t.flags.c_contiguous:
            tf, xf = flat(t), flat(x)
            for lo, hi in blocks(tf.size):
                tf[lo:hi] = cast(update(cast(tf[lo:hi], calc), xf[lo:hi], a, b), F16)
            return t
        r = update(t if calc == t_dt else cast(t, calc), x, a, b)
        t[...] = cast(r, t_dt) if t_dt == F16 else r
        return t

    if t_dt in (F16, F32) and x_dt in (F16, F32):
        round_x = t_dt == F16 and x_dt == F32        # X is rounded into t's dtype first

        def run_blocks(t, x, *extra):
            """update() block by block (the same element-wise operations), in scratch."""
            a, b = const if const is not None else _accumulate_coeffs(
                mode, scalar(extra[0], cdt), cdt)
            if not (t.flags.c_contiguous and x.shape == t.shape):
                return run(t, x, *extra)
            tf, xf = flat(t), flat(np.ascontiguousarray(x))
            jit = jit_loops() if tf.size > 0 else None
            if jit is not None:                       # one compiled pass, in element blocks
                tj, xj, av = jit_view(tf), jit_view(xf), cdt.type(1) if a is None else a
                each_range(shared(tf.size), lambda lo, hi: jit.moving_average(
                    tj[lo:hi], xj[lo:hi], av, b, square, a is not None, round_x))
                return t

            def block(lo: int, hi: int) -> None:
                n = hi - lo
                xv = scratch("acc_x", n)
                if x_dt == F16:
                    f16_into(xf[lo:hi], xv)
                else:
                    np.copyto(xv, xf[lo:hi])
                if round_x:
                    xv[...] = round_f16(xv)
                if square:
                    xv *= xv
                if b != 1:
                    xv *= b
                tb = tf[lo:hi]
                tv = tb if t_dt == F32 else _f32_into(tb, "acc_t")
                if a is None:
                    tv += xv
                else:
                    tv *= a
                    tv += xv
                if tv is not tb:
                    to_f16(tv, tb)
            each_range(blocks(tf.size), block)
            return t
        return run_blocks

    return run


@kernel("AccumulatorScale", modifies=(0,))
def _accumulator_scale_kernel(attrs, ins, outs):
    t_dt = np_dtype(ins[0])
    cdt, calc = _calc_dtypes(t_dt)
    if not attrs.get("f_tensor"):
        f = cdt.type(attrs["f"])
        if f == 0:
            def zero(t):
                t[...] = 0        # clears NaN / Inf too, as upstream's constant-0 case
                return t
            return zero

    def run(t, *extra):
        s = scalar(extra[0], cdt) if extra else cdt.type(attrs["f"])
        if calc == t_dt:
            t *= s
        else:
            r = cast(t, calc)
            r *= s
            t[...] = cast(r, t_dt) if t_dt == F16 else r
        return t
    return run


@kernel("SparseAccumulate", modifies=(0,))
def _sparse_accumulate_kernel(attrs, ins, outs):
    axis = int(attrs["axis"])
    t_dt = np_dtype(ins[0])
    cdt, calc = _calc_dtypes(t_dt)
    t_shape = ins[0].shape
    n_idx = ins[2].nelms
    x2 = t_shape[:axis] + (n_idx,) + t_shape[axis + 1:]
    f_tensor = attrs.get("f_tensor", False)
    f_const = None if f_tensor else cdt.type(attrs["f"])

    def run(t, x, indices, *extra):
        f = scalar(extra[0], cdt) if f_tensor else f_const
        idx = indices.reshape(-1).astype(np.int64, copy=False)
        xv = cast(x if x.dtype == t_dt else cast(x, t_dt), calc).reshape(x2)
        if f != 1:
            xv *= f
        tv = t if calc == t_dt else cast(t, calc)
        dim = t_shape[axis]
        if idx.size and (idx.min() < 0 or idx.max() >= dim):
            np.add.at(np.moveaxis(tv, axis, 0), idx, np.moveaxis(xv, axis, 0))  # wraps / raises
        else:
            scatter_add_rows(np.moveaxis(tv, axis, 0), idx, np.moveaxis(xv, axis, 0))
        if tv is not t:
            t[...] = cast(tv, t_dt) if t_dt == F16 else tv
        return t
    return run


@kernel("CopyVarUpdate", modifies=(0,))
def _copy_var_update_kernel(attrs, ins, outs):
    def run(t, x):
        t[...] = x
        return t
    return run


def _updater_factory(attrs, ins, outs):
    mode = attrs["mode"]
    has_w = attrs["has_weight"]
    wd_tensor = attrs.get("wd_tensor", False)
    has_step = attrs["has_step"]
    out_dt = np_dtype(outs[0])
    calc = F32 if out_dt in (F16, F32) else out_dt
    for i in ins:
        if np_dtype(i) not in (F16, F32):
            calc = np.dtype(np.float64)
    eps = calc.type(attrs["epsilon"])
    b1 = None if attrs["beta1"] is None else calc.type(attrs["beta1"])
    b2 = None if attrs["beta2"] is None else calc.type(attrs["beta2"])
    bias = attrs["bias_correction"]
    wd_const = calc.type(attrs.get("wd") or 0.0)
    one = calc.type(1)
    i_m = 1 if has_w else 0
    shape = outs[0].shape
    fused = calc == F32

    def run(*args, out=None):
        dm = dv = None
        if has_step:
            step = args[-1]
            step += 1                             # in place, before use (upstream)
            ts = calc.type(step.reshape(())[()])
            if bias:
                dm = one - np.power(b1, ts)
                if mode != "adamax":
                    dv = one - np.power(b2, ts)
        wd = (scalar(args[i_m + 2], calc) if wd_tensor else wd_const) if has_w else 0
        m_all, v_all = flat(args[i_m]), flat(args[i_m + 1])
        w_all = flat(args[0]) if has_w and wd != 0 else None
        res = np.empty(shape, out_dt) if out is None else out
        out_f = flat(res)
        jit = jit_loops() if fused and out_f.size > 0 else None
        if (jit is not None and dm is not None and dv is not None and mode != "adamax"
                and all(a.dtype in (F16, F32) for a in (m_all, v_all, out_f))
                and (w_all is None or w_all.dtype in (F16, F32))):
            m_j, v_j, o_j = jit_view(m_all), jit_view(v_all), jit_view(out_f)
            if w_all is None:
                each_range(shared(o_j.size), lambda lo, hi: jit.adam_update(
                    m_j[lo:hi], v_j[lo:hi], o_j[lo:hi], dm, dv, eps))
            else:
                w_j, wd32 = jit_view(w_all), F32.type(wd)
                each_range(shared(o_j.size), lambda lo, hi: jit.adam_update_wd(
                    m_j[lo:hi], v_j[lo:hi], w_j[lo:hi], o_j[lo:hi], dm, dv, eps, wd32))
            return res
        # m / dm / (sqrt(v / dv) + eps) + wd * w, block by block (the same operations as on
        # whole arrays: element-wise)
        def block(lo: int, hi: int) -> None:
            n = hi - lo
            m = _f32_into(m_all[lo:hi], "adam_m") if fused else cast(m_all[lo:hi], calc)
            v = _f32_into(v_all[lo:hi], "adam_v") if fused else cast(v_all[lo:hi], calc)
            if dm is not None:
                m /= dm
            if dv is not None:
                v /= dv
            if mode != "adamax":
                np.sqrt(v, out=v)
            v += eps
            o = out_f[lo:hi]
            x = o if o.dtype == calc else scratch("adam_x", n, calc)
            np.divide(m, v, out=x)
            if w_all is not None:
                t = scratch("adam_t", n, calc)
                if fused and w_all.dtype == F16:
                    f16_into(w_all[lo:hi], t)
                else:
                    t[...] = w_all[lo:hi]
                t *= wd
                x += t
            if x is not o:
                if out_dt == F16 and x.dtype == F32:
                    to_f16(x, o)
                else:
                    o[...] = x if out_dt == calc else cast(x, out_dt)
        each_range(blocks(out_f.size), block)
        return res
    return run


def _f32_into(a: np.ndarray, tag: str) -> np.ndarray:
    """A float32 copy of a float16 / float32 block, in scratch `tag`."""
    buf = scratch(tag, a.size)
    if a.dtype == F16:
        f16_into(a, buf)
    else:
        np.copyto(buf, a)
    return buf


def _step_written(attrs, n_inputs):
    """The step, when given, is the last input and is incremented in place."""
    return (n_inputs - 1,) if attrs.get("has_step") else ()


# The updaters return a new array (the update), not their input.
for _t in ("AdamUpdater", "LambUpdater", "AdaMaxUpdater"):
    kernel(_t, modifies=_step_written, returns_input=False, writes_out=True)(_updater_factory)


@kernel("AdamVarUpdate", modifies=(0,))
def _adam_var_update_kernel(attrs, ins, outs):
    t_dt = np_dtype(ins[0])
    cdt, calc = _calc_dtypes(t_dt)
    lr_tensor, mwn_tensor = attrs.get("lr_tensor", False), attrs.get("mwn_tensor", False)
    lr_c = None if lr_tensor else cdt.type(attrs["lr"])
    mwn_c = None if mwn_tensor else cdt.type(attrs["mwn"])

    def run(t, x, r1, r2, *extra):
        i = 0
        lr = lr_c
        if lr_tensor:
            lr = scalar(extra[0], cdt)
            i = 1
        mwn = scalar(extra[i], cdt) if mwn_tensor else mwn_c
        r1s, r2s = scalar(r1, cdt), scalar(r2, cdt)
        if r1s == 0 or r2s == 0 or mwn == 0:
            ratio = cdt.type(1)
        else:
            ratio = np.minimum(np.sqrt(r1s), mwn) / np.sqrt(r2s)
        scale = cdt.type(lr * ratio)
        if calc == t_dt and x.dtype == t_dt:
            t -= scale * x
        else:
            r = cast(t, calc) - scale * cast(x, calc)
            t[...] = cast(r, t_dt) if t_dt == F16 else r
        return t
    return run
