"""Kernels: the element-wise family (unary math, activations, logic, comparisons, clip, pow, fmod,
Max, Where, IncrementMod), their in-place variants and their dedicated grad ops."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ._util import F16, F32, np_dtype, via_f32
from .registry import kernel

__all__ = ["erfc_f32", "gelu_erf", "gelu_erf_grad"]

F64 = np.dtype(np.float64)
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_ERFC64 = np.frompyfunc(math.erfc, 1, 1)


def erfc_f32(z: np.ndarray) -> np.ndarray:
    """erfc for float32-accurate work (fractional error < 1.2e-7, Numerical Recipes `erfcc`)."""
    a = np.abs(z).astype(F64)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(-a * a + poly)
    return np.where(z >= 0, r, 2.0 - r)


def _phi_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF 0.5 * erfc(-x / sqrt(2)); exact (libm) for float64."""
    if x.dtype == F64:
        return 0.5 * _ERFC64(-x * _SQRT1_2).astype(F64)
    return (0.5 * erfc_f32(-x * _SQRT1_2)).astype(x.dtype)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU x * Phi(x)."""
    return x * _phi_cdf(x)


def gelu_erf_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dy * (Phi(x) + x * phi(x))."""
    pdf = np.exp(-0.5 * x * x) * x.dtype.type(_INV_SQRT_2PI)
    return dy * (_phi_cdf(x) + x * pdf)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(x/2)) never overflows
    return 0.5 * (1 + np.tanh(0.5 * x))


def _swish(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _swish_grad(dy: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return dy * (s + y * (1 - s))


def _sign(x: np.ndarray) -> np.ndarray:
    s = np.sign(x)
    if x.dtype.kind == "f":
        s = np.where(np.isnan(s), s.dtype.type(0), s)
    return s


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))


def _float_or_int(fn: Callable, int_identity: bool = False) -> Callable:
    """Float kernels run in float32 for float16 inputs; other dtypes run `fn` directly
    (`int_identity`: integer inputs are returned as a copy, e.g. ceil/floor)."""
    def factory(attrs, ins, outs):
        dt = np_dtype(outs[0])
        if int_identity and dt.kind in "iub":
            return lambda x: np.array(x, copy=True)
        return via_f32(fn, dt)
    return factory


def _in_place(fn: Callable) -> Callable:
    """Modifying variant of a unary kernel: writes fn(x) into x and returns x."""
    def factory(attrs, ins, outs):
        f = via_f32(fn, np_dtype(ins[0]))

        def run(x):
            x[...] = f(x)
            return x
        return run
    return factory


# name, out-of-place type, in-place type (or None), function
_UNARY = (
    ("Abs", None, np.abs),
    ("Exp", "ExpInplace", np.exp),
    ("Log", None, np.log),
    ("Sqrt", None, np.sqrt),
    ("Sin", None, np.sin),
    ("Cos", None, np.cos),
    ("Tanh", None, np.tanh),
    ("Relu", "ReluInplace", _relu),
    ("GeluErf", "GeluErfInplace", gelu_erf),
    ("Swish", "SwishInplace", _swish),
    ("Ceil", None, np.ceil),
    ("Floor", None, np.floor),
    ("Sign", None, _sign),
)


def _quiet(fn: Callable) -> Callable:
    """`fn` without NumPy floating point warnings (log(0), sqrt(-1), overflow: IEEE results)."""
    def run(*a):
        with np.errstate(all="ignore"):
            return fn(*a)
    return run


for _t, _tin, _fn in _UNARY:
    kernel(_t)(_float_or_int(_quiet(_fn), int_identity=_t in ("Ceil", "Floor")))
    if _tin:
        kernel(_tin, modifies=(0,))(_in_place(_quiet(_fn)))


@kernel("IsNaN")
def _isnan(attrs, ins, outs):
    if np_dtype(ins[0]).kind != "f":
        return lambda x: np.zeros(x.shape, np.bool_)
    return np.isnan


@kernel("IsInf")
def _isinf(attrs, ins, outs):
    if np_dtype(ins[0]).kind != "f":
        return lambda x: np.zeros(x.shape, np.bool_)
    return np.isinf


@kernel("Not")
def _not(attrs, ins, outs):
    return np.logical_not


kernel("And")(lambda attrs, ins, outs: np.logical_and)
kernel("Or")(lambda attrs, ins, outs: np.logical_or)
kernel("Equal")(lambda attrs, ins, outs: np.equal)
kernel("Greater")(lambda attrs, ins, outs: np.greater)


def _clip_bounds(attrs, dt: np.dtype):
    lo, hi = float(attrs["min"]), float(attrs["max"])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo = int(np.clip(math.ceil(lo) if math.isfinite(lo) else lo, info.min, info.max))
        hi = int(np.clip(math.floor(hi) if math.isfinite(hi) else hi, info.min, info.max))
        return dt.type(lo), dt.type(hi)
    calc = F32 if dt == F16 else dt
    return calc.type(lo), calc.type(hi)


@kernel("Clip")
def _clip(attrs, ins, outs):
    dt = np_dtype(outs[0])
    lo, hi = _clip_bounds(attrs, dt)
    # ONNX: min > max sets everything to max (minimum applied last)
    return via_f32(lambda x: np.minimum(np.maximum(x, lo), hi), dt)


@kernel("ClipGrad")
def _clip_grad(attrs, ins, outs):
    dt = np_dtype(ins[1])
    lo, hi = _clip_bounds(attrs, dt)

    def run(dy, x):
        keep = (x >= lo) & (x <= hi)
        return np.where(keep, dy, dy.dtype.type(0))
    return run


@kernel("Pow")
def _pow(attrs, ins, outs):
    dt = np_dtype(outs[0])
    if dt.kind in "iu":
        def int_pow(a, b):
            with np.errstate(all="ignore"):
                r = np.trunc(np.power(a.astype(F64), b.astype(F64)))
                return np.nan_to_num(r, nan=0).astype(dt)
        return int_pow
    return via_f32(_quiet(np.power), dt)


@kernel("PowArg0Grad")
def _pow_arg0_grad(attrs, ins, outs):
    """d(a**b)/da * dy = dy * b * a**(b-1) (output has dy's broadcast shape)."""
    def run(dy, a, b):
        return dy * b * np.power(a, b - 1)
    return via_f32(_quiet(run), np_dtype(outs[0]))


@kernel("PowArg1Grad")
def _pow_arg1_grad(attrs, ins, outs):
    """d(a**b)/db * dy = dy * a**b * log(a) (output has dy's broadcast shape)."""
    def run(dy, a, y):
        return dy * y * np.log(a)
    return via_f32(_quiet(run), np_dtype(outs[0]))


@kernel("Fmod")
def _fmod(attrs, ins, outs):
    return via_f32(_quiet(np.fmod), np_dtype(outs[0]))


@kernel("FmodArg1Grad")
def _fmod_arg1_grad(attrs, ins, outs):
    """d fmod(a, b)/db * dy = -dy * trunc(a / b)."""
    def run(dy, a, b):
        return -dy * np.trunc(a / b)
    return via_f32(_quiet(run), np_dtype(outs[0]))


@kernel("Max")
def _max(attrs, ins, outs):
    if len(ins) == 1:
        return lambda x: np.array(x, copy=True)

    def run(*xs):
        r = np.maximum(xs[0], xs[1])
        for x in xs[2:]:
            r = np.maximum(r, x)
        return r
    return run


@kernel("MaxArgGrad")
def _max_arg_grad(attrs, ins, outs):
    """dy where this input equals the max (every tied input gets the full dy, as upstream)."""
    def run(dy, x, y):
        return np.where(x == y, dy, dy.dtype.type(0))
    return run


@kernel("Where")
def _where(attrs, ins, outs):
    dt = np_dtype(outs[0])
    return lambda c, a, b: np.where(c, a, b).astype(dt, copy=False)


def _increment_mod_fn(attrs, dt: np.dtype):
    if dt.kind in "iu":
        inc, mod = dt.type(attrs["increment"]), dt.type(attrs["modulus"])
    else:
        calc = F32 if dt == F16 else dt
        inc, mod = calc.type(attrs["increment"]), calc.type(attrs["modulus"])
    return via_f32(lambda x: np.fmod(x + inc, mod), dt)


@kernel("IncrementMod")
def _increment_mod(attrs, ins, outs):
    return _increment_mod_fn(attrs, np_dtype(outs[0]))


@kernel("IncrementModInplace", modifies=(0,))
def _increment_mod_inplace(attrs, ins, outs):
    f = _increment_mod_fn(attrs, np_dtype(ins[0]))

    def run(x):
        x[...] = f(x)
        return x
    return run


# --- dedicated grad ops -----------------------------------------------------------------------

@kernel("ReluGrad")
def _relu_grad(attrs, ins, outs):
    """dy where the forward output y > 0."""
    return lambda dy, y: np.where(y > 0, dy, dy.dtype.type(0))


@kernel("GeluErfGrad")
def _gelu_erf_grad(attrs, ins, outs):
    return via_f32(gelu_erf_grad, np_dtype(outs[0]))


@kernel("SwishGrad")
def _swish_grad_kernel(attrs, ins, outs):
    return via_f32(_quiet(_swish_grad), np_dtype(outs[0]))


@kernel("TanhGrad")
def _tanh_grad(attrs, ins, outs):
    """dy * (1 - y^2) from the forward output."""
    return via_f32(lambda dy, y: dy * (1 - y * y), np_dtype(outs[0]))
