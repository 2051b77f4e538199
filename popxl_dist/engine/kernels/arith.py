"""Kernels: binary arithmetic (Add, Sub, Mul, Div, Neg, their in-place variants) and ScaledAdd."""
from __future__ import annotations

import numpy as np

from ._util import (F16, F32, blocks, cast, flat, from_f16, jit_loops, jit_view, np_dtype,
                    scalar, scratch, to_f16, ufunc_out, via_f32, without_out)
from ._blocks import as_f32, binary_blocks, binary_f32, each_range, shared, store
from .registry import kernel


def _binary(ufunc):
    def factory(attrs, ins, outs):
        dt = np_dtype(outs[0])
        if dt == F16:
            fn = None
            if all(np_dtype(i) in (F16, F32) for i in ins):
                fn = binary_f32(ufunc, ins[0].shape, ins[1].shape, outs[0].shape, dt)
            return fn or without_out(via_f32(ufunc, dt))
        fn = ufunc_out(ufunc, ins, outs)
        if fn is ufunc:
            return binary_blocks(ufunc, [i.shape for i in ins], outs[0].shape)
        return fn
    return factory


kernel("Add", writes_out=True, inplace=True)(_binary(np.add))
kernel("Sub", writes_out=True, inplace=True)(_binary(np.subtract))
kernel("Mul", writes_out=True, inplace=True)(_binary(np.multiply))


@kernel("Div", writes_out=True, inplace=True)
def _div(attrs, ins, outs):
    dt = np_dtype(outs[0])
    if dt.kind in "iu":
        def int_div(a, b):
            # C / poplar integer division truncates toward zero. Division by zero gives 0
            # (NumPy's integer convention; the IPU's result is unspecified), without the
            # floating-point events the float64 route would raise.
            zero = b == 0
            if zero.any():
                b = np.where(zero, 1, b)
                q = np.trunc(np.divide(a, b, dtype=np.float64))
                return np.where(zero, 0, q).astype(dt)
            return np.trunc(np.divide(a, b, dtype=np.float64)).astype(dt)
        return without_out(int_div)
    return _binary(np.divide)(attrs, ins, outs)


def _inplace(ufunc):
    def factory(attrs, ins, outs):
        if np_dtype(ins[0]) == F16:
            fused = None
            if np_dtype(ins[1]) in (F16, F32):
                fused = binary_f32(ufunc, ins[0].shape, ins[1].shape, ins[0].shape, F16)

            def run16(a, b):
                if (fused is not None and a.flags.c_contiguous
                        and (b is a or not np.may_share_memory(a, b))):
                    return fused(a, b, out=a)
                a[...] = to_f16(ufunc(from_f16(a), cast(b, F32)))
                return a
            return run16

        def run(a, b):
            ufunc(a, b, out=a)
            return a
        return run
    return factory


kernel("AddLhsInplace", modifies=(0,))(_inplace(np.add))


@kernel("AddRhsInplace", modifies=(1,))
def _add_rhs_inplace(attrs, ins, outs):
    if np_dtype(ins[1]) == F16:
        def run16(a, b):
            b[...] = to_f16(np.add(cast(a, F32), from_f16(b)))
            return b
        return run16

    def run(a, b):
        np.add(a, b, out=b)
        return b
    return run


@kernel("Neg")
def _neg(attrs, ins, outs):
    return np.negative


def _scaled_add_fn(attrs, ins):
    """aX + bY with a/b either baked floats (attrs) or runtime scalar tensors (extra inputs)."""
    a_const, b_const = attrs.get("a"), attrs.get("b")
    a_is_t, b_is_t = attrs.get("a_tensor", False), attrs.get("b_tensor", False)
    out = np_dtype(ins[0])
    calc = F32 if out == F16 or np_dtype(ins[1]) == F16 else out

    def coeffs(extra):
        i = 0
        a = a_const
        b = b_const
        if a_is_t:
            a = scalar(extra[i], calc)
            i += 1
        if b_is_t:
            b = scalar(extra[i], calc)
        return a, b

    return calc, out, coeffs


@kernel("ScaledAdd", writes_out=True)
def _scaled_add(attrs, ins, outs):
    calc, out, coeffs = _scaled_add_fn(attrs, ins)
    same = (ins[0].shape == ins[1].shape == outs[0].shape
            and np_dtype(outs[0]) == out and calc == out and np_dtype(ins[1]) == out)
    mixed = (not same and ins[0].shape == ins[1].shape == outs[0].shape and calc == F32
             and all(np_dtype(t) in (F16, F32) for t in (ins[0], ins[1], outs[0])))

    def run(x, y, *extra, out=None):
        a, b = coeffs(extra)
        if mixed and out is not None and out.flags.c_contiguous:
            # float16 somewhere: a * x + b * y in float32 block by block, rounded once
            of, xf = flat(out), flat(np.ascontiguousarray(x))
            yf = flat(np.ascontiguousarray(y))
            ac, bc = calc.type(a), calc.type(b)

            def block16(lo: int, hi: int) -> None:
                r = scratch("sadd_r", hi - lo)
                np.multiply(as_f32(xf[lo:hi], "sadd_x"), ac, out=r)
                t = scratch("sadd_t", hi - lo)
                np.multiply(as_f32(yf[lo:hi], "sadd_y"), bc, out=t)
                r += t
                store(r, of[lo:hi])
            each_range(blocks(of.size), block16)
            return out
        if same and out is not None and out.flags.c_contiguous:
            of, xf = flat(out), flat(np.ascontiguousarray(x))
            yf = flat(np.ascontiguousarray(y))
            ac, bc = calc.type(a), calc.type(b)

            def block(lo: int, hi: int) -> None:
                np.multiply(xf[lo:hi], ac, out=of[lo:hi])
                yb = scratch("scaled_add_y", hi - lo, calc)
                np.multiply(yf[lo:hi], bc, out=yb)
                of[lo:hi] += yb
            each_range(blocks(of.size), block)
            return out
        r = _in(x, calc) * calc.type(a)
        r += _in(y, calc) * calc.type(b)
        r = r if out_dt == calc else cast(r, out_dt)
        if out is not None:
            out[...] = r
            return out
        return r
    out_dt = out
    return run


def _in(x: np.ndarray, calc: np.dtype) -> np.ndarray:
    """`x` in the compute dtype (a float16 operand converted quickly; others as they are)."""
    return from_f16(x) if x.dtype == F16 and calc == F32 else x


@kernel("ScaledAddLhsInplace", modifies=(0,))
def _scaled_add_inplace(attrs, ins, outs):
    calc, out, coeffs = _scaled_add_fn(attrs, ins)
    if calc == out and not attrs.get("a_tensor") and not attrs.get("b_tensor"):
        a = calc.type(attrs["a"])
        b = calc.type(attrs["b"])
        if a == 1:
            def run_fast(x, y):
                if y.dtype == out and y.shape == x.shape and x.flags.c_contiguous:
                    xf, yf = flat(x), flat(np.ascontiguousarray(y))
                    jit = jit_loops() if out == F32 and xf.size > 0 else None
                    if jit is not None:                # x += b * y, one compiled pass
                        each_range(shared(xf.size),
                                   lambda lo, hi: jit.axpy(xf[lo:hi], yf[lo:hi], b))
                        return x

                    def block(lo: int, hi: int) -> None:   # x += b * y, in cache
                        yb = scratch("scaled_add_y", hi - lo, out)
                        np.multiply(b, yf[lo:hi], out=yb)
                        xf[lo:hi] += yb
                    each_range(blocks(xf.size), block)
                elif y.dtype == out:
                    x += b * y
                elif y.dtype == F16 and x.flags.c_contiguous:
                    xf, yf = flat(x), flat(np.ascontiguousarray(y))
                    jit = jit_loops() if out == F32 and xf.size > 0 else None
                    if jit is not None and y.shape == x.shape:
                        yj = jit_view(yf)
                        each_range(shared(xf.size),
                                   lambda lo, hi: jit.axpy(xf[lo:hi], yj[lo:hi], b))
                        return x

                    def block16(lo: int, hi: int) -> None:   # float16 y: convert in cache
                        yc = from_f16(yf[lo:hi])
                        yc *= b
                        xf[lo:hi] += yc
                    each_range(blocks(xf.size), block16)
                else:
                    yc = _in(y, calc)
                    yc *= b
                    x += yc
                return x
            return run_fast

    def run(x, y, *extra):
        a, b = coeffs(extra)
        if (x.flags.c_contiguous and x.shape == y.shape and x.dtype in (F16, F32)
                and y.dtype in (F16, F32) and calc == F32):
            xf, yf = flat(x), flat(np.ascontiguousarray(y))
            jit = jit_loops() if xf.size > 0 else None
            ac, bc = calc.type(a), calc.type(b)
            if jit is not None:                  # a * x + b * y, one compiled pass
                xj, yj = jit_view(xf), jit_view(yf)
                each_range(shared(xf.size),
                           lambda lo, hi: jit.scaled_add(xj[lo:hi], yj[lo:hi], ac, bc))
                return x

            def block(lo: int, hi: int) -> None:      # a * x + b * y, block by block
                xb = as_f32(xf[lo:hi], "sadd_x")
                r = scratch("sadd_r", hi - lo)
                np.multiply(xb, ac, out=r)
                yb = as_f32(yf[lo:hi], "sadd_y")
                t = scratch("sadd_t", hi - lo)
                np.multiply(yb, bc, out=t)
                r += t
                store(r, xf[lo:hi])
            each_range(blocks(xf.size), block)
            return x
        r = _in(x, calc) * calc.type(a)
        r += _in(y, calc) * calc.type(b)
        x[...] = r if out == calc else cast(r, out)
        return x
    return run
