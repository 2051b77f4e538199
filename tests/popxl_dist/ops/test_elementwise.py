"""The element-wise op family: kernels vs NumPy, gradients vs finite differences, in-place
variants, op types / output names, and builder errors."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Tuple

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import grads, numeric_grads, run_ops
from popxl.engine.kernels.registry import KERNELS
from popxl.transforms.grad_registry import GRAD_RULES, NO_GRAD, THROWS, load_all

F16, F32, F64, I32, B = np.float16, np.float32, np.float64, np.int32, np.bool_
_ERF = np.vectorize(math.erf, otypes=[np.float64])


# --- NumPy references -------------------------------------------------------------------------

def _geluerf_ref(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + _ERF(x / np.sqrt(2)))


def _swish_ref(x):
    x = x.astype(np.float64)
    return x / (1 + np.exp(-x))


def _sign_ref(x):
    return np.where(np.isnan(x), 0, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


def _as_bool(x):
    return x.astype(bool)


def _data(kind: str, dtype, shape=(3, 4), seed=0) -> np.ndarray:
    """Test inputs: 'any' (signed), 'pos' (> 0), 'special' (nan/inf mixed in), 'small' ints."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == B:
        return rng.random(shape) > 0.5
    if kind == "pos":
        x = rng.uniform(0.3, 3.0, shape)
    elif kind == "small":
        x = rng.integers(-3, 4, shape)
    else:
        x = rng.uniform(-3.0, 3.0, shape)
        if np.dtype(dtype).kind in "iu":
            x = np.round(x * 3)
    x = x.astype(dtype)
    if kind == "special" and x.dtype.kind == "f":
        flat = x.reshape(-1)
        flat[:4] = [np.nan, np.inf, -np.inf, 0]
    return x


class Unary(NamedTuple):
    name: str
    fn: Callable
    ref: Callable
    dtypes: Tuple
    kind: str = "any"
    op_type: Optional[str] = None     # the type of the op producing the output
    out_name: Optional[str] = None


UNARY = [
    Unary("abs", ops.abs, np.abs, (F32, F16, I32), "special", "Abs", "abs_out"),
    Unary("exp", ops.exp, np.exp, (F32, F16), "any", "Exp", "exp_out"),
    Unary("log", ops.log, np.log, (F32, F16), "pos", "Log", "log_out"),
    Unary("log2", ops.log2, np.log2, (F32, F16), "pos", "Div", "div_out"),
    Unary("sqrt", ops.sqrt, np.sqrt, (F32, F16), "pos", "Sqrt", "sqrt_out"),
    Unary("sin", ops.sin, np.sin, (F32, F16), "any", "Sin", "sin_out"),
    Unary("cos", ops.cos, np.cos, (F32, F16), "any", "Cos", "cos_out"),
    Unary("tanh", ops.tanh, np.tanh, (F32, F16), "any", "Tanh", "tanh_out"),
    Unary("relu", ops.relu, lambda x: np.maximum(x, 0), (F32, F16, I32), "any", "Relu",
          "relu_out"),
    Unary("geluerf", ops.geluerf, _geluerf_ref, (F32, F16), "any", "GeluErf", "geluerf_out"),
    Unary("swish", ops.swish, _swish_ref, (F32, F16), "any", "Swish", "swish_out"),
    Unary("ceil", ops.ceil, np.ceil, (F32, F16, I32), "special", "Ceil", "ceil_out"),
    Unary("floor", ops.floor, np.floor, (F32, F16, I32), "special", "Floor", "floor_out"),
    Unary("sign", ops.sign, _sign_ref, (F32, F16, I32), "special", "Sign", "sign_out"),
    Unary("isnan", ops.isnan, np.isnan, (F32, F16), "special", "IsNaN", "isnan_out"),
    Unary("isinf", ops.isinf, np.isinf, (F32, F16), "special", "IsInf", "isinf_out"),
    Unary("isfinite", ops.isfinite, np.isfinite, (F32, F16), "special", "Identity",
          "isfinite_out"),
    Unary("logical_not", ops.logical_not, lambda x: ~_as_bool(x), (B, F32, I32), "any", "Not",
          "logical_not_out"),
    Unary("clip", lambda t: ops.clip(t, -1.5, 2), lambda x: np.clip(x, -1.5, 2),
          (F32, F16, I32), "special", "Clip", "clip_out"),
    Unary("clamp_min_only", lambda t: ops.clamp(t, min=0.5), lambda x: np.maximum(x, 0.5),
          (F32,), "any", "Clip", "clip_out"),
    Unary("clip_min_gt_max", lambda t: ops.clip(t, 1, -1), lambda x: np.full_like(x, -1),
          (F32,), "any", "Clip", "clip_out"),
    Unary("increment_mod", lambda t: ops.increment_mod(t, 2, 3),
          lambda x: np.fmod(x + 2, 3), (F32, I32), "any", "IncrementMod", "increment_mod_out"),
    Unary("pow_scalar", lambda t: ops.pow(t, 2), lambda x: x.astype(np.float64) ** 2,
          (F32, F16, I32), "any", "Pow", "pow_out"),
]


def _tol(dtype):
    return dict(rtol=2e-3, atol=2e-3) if dtype == F16 else dict(rtol=1e-5, atol=1e-6)


def _check(got, want, dtype):
    if want.dtype == B or got.dtype == B:
        np.testing.assert_array_equal(got, want)
        return
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(got, want.astype(dtype))
        return
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                               equal_nan=True, **_tol(dtype))


@pytest.mark.parametrize("case,dtype", [(c, d) for c in UNARY for d in c.dtypes],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
def test_unary_kernel(case: Unary, dtype):
    x = _data(case.kind, dtype)
    got, = run_ops(case.fn, x)
    want = case.ref(x.astype(np.float32) if dtype == F16 else x)
    out_dtype = B if np.asarray(want).dtype == B else dtype
    assert got.dtype == out_dtype and got.shape == x.shape
    _check(got, want, dtype)


def _producer(g, t):
    return next(op for op in g._data.ops if t.id in op.outputs)


@pytest.mark.parametrize("case", UNARY, ids=lambda c: c.name)
def test_unary_op_type_and_name(case: Unary):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(_data(case.kind, case.dtypes[0]), name="x")
        y = case.fn(x)
        assert _producer(ir.main_graph, y).type == case.op_type
        assert y.name == case.out_name


# --- binary / n-ary ---------------------------------------------------------------------------

class Binary(NamedTuple):
    name: str
    fn: Callable
    ref: Callable
    dtypes: Tuple
    kinds: Tuple[str, str] = ("any", "any")
    op_type: str = ""
    out_name: str = ""


def _fmod_rhs(x):
    return np.where(x == 0, 1, x).astype(x.dtype)


BINARY = [
    Binary("pow", ops.pow, lambda a, b: np.power(a.astype(np.float64), b), (F32, F16),
           ("pos", "any"), "Pow", "pow_out"),
    Binary("pow_int", ops.pow, lambda a, b: np.power(a.astype(np.int64), np.abs(b)), (I32,),
           ("small", "small"), "Pow", "pow_out"),
    Binary("fmod", ops.fmod, np.fmod, (F32, F16, I32), ("any", "any"), "Fmod", "fmod_out"),
    Binary("equal", ops.equal, np.equal, (F32, I32, B), ("small", "small"), "Equal",
           "equal_out"),
    Binary("greater", ops.greater, np.greater, (F32, F16, I32), ("small", "small"), "Greater",
           "greater_out"),
    Binary("logical_and", ops.logical_and, lambda a, b: _as_bool(a) & _as_bool(b), (B, F32, I32),
           ("small", "small"), "And", "logical_and_out"),
    Binary("logical_or", ops.logical_or, lambda a, b: _as_bool(a) | _as_bool(b), (B, F32, I32),
           ("small", "small"), "Or", "logical_or_out"),
    Binary("maximum", ops.maximum, np.maximum, (F32, F16, I32), ("any", "any"), "Max",
           "maximum_out"),
]


def _binary_inputs(case: Binary, dtype):
    a = _data(case.kinds[0], dtype, (2, 3, 4), seed=1)
    b = _data(case.kinds[1], dtype, (3, 1), seed=2)     # broadcasts against a
    if case.name == "fmod":
        b = _fmod_rhs(b)
    if case.name == "pow_int":
        b = np.abs(b)
    return a, b


@pytest.mark.parametrize("case,dtype", [(c, d) for c in BINARY for d in c.dtypes],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
def test_binary_kernel(case: Binary, dtype):
    a, b = _binary_inputs(case, dtype)
    got, = run_ops(case.fn, a, b)
    f = (lambda x: x.astype(np.float32)) if dtype == F16 else (lambda x: x)
    want = case.ref(f(a), f(b))
    assert got.shape == (2, 3, 4)
    assert got.dtype == (B if np.asarray(want).dtype == B else dtype)
    _check(got, want, dtype)


@pytest.mark.parametrize("case", BINARY, ids=lambda c: c.name)
def test_binary_op_type_and_name(case: Binary):
    ir = popxl.Ir()
    with ir.main_graph:
        a, b = (popxl.variable(v) for v in _binary_inputs(case, case.dtypes[0]))
        y = case.fn(a, b)
        assert _producer(ir.main_graph, y).type == case.op_type
        assert y.name == case.out_name


def test_maximum_n_ary_and_single():
    a = _data("any", F32, (2, 3), 1)
    b = _data("any", F32, (3,), 2)
    c = _data("any", F32, (2, 1), 3)
    got, = run_ops(ops.maximum, a, b, c)
    np.testing.assert_array_equal(got, np.maximum(np.maximum(a, b), c))
    got, = run_ops(ops.maximum, a)
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("cond_dtype", [B, I32, F32])
def test_where_kernel(cond_dtype):
    c = np.array([[1, 0, 2], [0, 0, 3]]).astype(cond_dtype)
    a = _data("any", F32, (2, 3), 1)
    b = _data("any", F32, (3,), 2)
    got, = run_ops(ops.where, c, a, b)
    np.testing.assert_array_equal(got, np.where(c.astype(bool), a, b))
    got, = run_ops(ops.where, c[:1], a[:1, :1], b)   # three-way broadcast
    np.testing.assert_array_equal(got, np.where(c[:1].astype(bool), a[:1, :1], b))


def test_where_op_type_and_name():
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.variable(np.array([1, 0], np.int32))
        y = ops.where(c, popxl.variable(np.ones(2, F32)), popxl.variable(np.zeros(2, F32)))
        op = _producer(ir.main_graph, y)
        assert (op.type, y.name) == ("Where", "where_out")
        assert ir.main_graph._tensor(op.inputs[0]).dtype == popxl.bool   # cast to bool


def test_pow_scalar_exponent_is_constant_of_base_dtype():
    x = _data("pos", F16, (2, 3))
    got, = run_ops(lambda t: ops.pow(t, 0.5), x)
    assert got.dtype == F16
    np.testing.assert_allclose(got, np.sqrt(x.astype(F32)), rtol=2e-3)


def test_sign_of_nan_is_zero_and_floor_ceil_keep_nan():
    x = np.array([np.nan, -0.5, 0.0, 2.5], F32)
    s, c, f = run_ops(lambda t: (ops.sign(t), ops.ceil(t), ops.floor(t)), x)
    np.testing.assert_array_equal(s, [0, -1, 0, 1])
    assert np.isnan(c[0]) and np.isnan(f[0])


# --- gradients --------------------------------------------------------------------------------

class GradCase(NamedTuple):
    name: str
    fn: Callable
    kinds: Tuple[str, ...]
    shapes: Tuple[Tuple[int, ...], ...] = ((2, 3),)


def _away_from_kinks(x):
    """Shift values away from 0 and integers (kinks of abs/relu/ceil/floor/sign)."""
    frac = x - np.round(x)
    return np.where(np.abs(frac) < 0.15, x + 0.3, x)


GRADS = [
    GradCase("abs", ops.abs, ("any",)),
    GradCase("exp", ops.exp, ("any",)),
    GradCase("log", ops.log, ("pos",)),
    GradCase("log2", ops.log2, ("pos",)),
    GradCase("sqrt", ops.sqrt, ("pos",)),
    GradCase("sin", ops.sin, ("any",)),
    GradCase("cos", ops.cos, ("any",)),
    GradCase("tanh", ops.tanh, ("any",)),
    GradCase("relu", ops.relu, ("any",)),
    GradCase("geluerf", ops.geluerf, ("any",)),
    GradCase("swish", ops.swish, ("any",)),
    GradCase("ceil", ops.ceil, ("any",)),
    GradCase("floor", ops.floor, ("any",)),
    GradCase("sign", ops.sign, ("any",)),
    GradCase("clip", lambda t: ops.clip(t, -1.2, 1.7), ("any",)),
    GradCase("pow_scalar", lambda t: ops.pow(t, 3.0), ("any",)),
    GradCase("pow", ops.pow, ("pos", "any"), ((2, 3), (3,))),
    GradCase("fmod", ops.fmod, ("any", "pos"), ((2, 3), (2, 1))),
    GradCase("maximum", ops.maximum, ("any", "any"), ((2, 3), (3,))),
    GradCase("maximum3", lambda a, b, c: ops.maximum(a, b, c), ("any", "any", "any"),
             ((2, 3), (3,), (2, 1))),
]


@pytest.mark.parametrize("case", GRADS, ids=lambda c: c.name)
def test_grad_vs_finite_differences(case: GradCase):
    xs = [_away_from_kinks(_data(k, F64, s, seed=i + 3))
          for i, (k, s) in enumerate(zip(case.kinds, case.shapes))]
    out, = run_ops(case.fn, *xs)
    dy = _data("any", F64, out.shape, seed=9)
    _, got = grads(case.fn, xs, [dy])
    want = numeric_grads(case.fn, xs, [dy])
    assert len(got) == len(xs)
    for g, w, x in zip(got, want, xs):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_zero_grads_are_exact_zeros():
    x = _data("any", F64, (2, 3))
    dy = np.ones((2, 3))
    for f in (ops.ceil, ops.floor, ops.sign):
        _, (g,) = grads(f, [x], [dy])
        np.testing.assert_array_equal(g, np.zeros_like(x))


def test_where_grad_masks_lhs_and_rhs():
    c = np.array([[True, False, True], [False, False, True]])
    a = _data("any", F64, (2, 3), 1)
    b = _data("any", F64, (3,), 2)
    dy = _data("any", F64, (2, 3), 3)
    _, (ga, gb) = grads(ops.where, [c, a, b], [dy])
    np.testing.assert_allclose(ga, np.where(c, dy, 0))
    np.testing.assert_allclose(gb, np.where(c, 0, dy).sum(0))


def test_maximum_grad_ties_give_full_dy_to_each():
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1.0, 5.0, 0.0])
    dy = np.array([0.5, 0.25, 2.0])
    _, (ga, gb) = grads(ops.maximum, [a, b], [dy])
    np.testing.assert_array_equal(ga, [0.5, 0, 2.0])
    np.testing.assert_array_equal(gb, [0.5, 0.25, 0])


def test_geluerf_float32_grad_close_to_float64():
    x = _data("any", F32, (4, 5))
    dy = np.ones_like(x)
    _, (g32,) = grads(ops.geluerf, [x], [dy])
    _, (g64,) = grads(ops.geluerf, [x.astype(F64)], [dy.astype(F64)])
    np.testing.assert_allclose(g32, g64, rtol=1e-5, atol=1e-6)


ELEMENTWISE_TYPES = {
    "grad": ["Abs", "Exp", "Log", "Sqrt", "Sin", "Cos", "Tanh", "Relu", "GeluErf", "Swish",
             "Ceil", "Floor", "Sign", "Clip", "Pow", "Fmod", "Max", "Where"],
    "no_grad": ["IsNaN", "IsInf", "IncrementMod", "ExpInplace", "ReluInplace", "GeluErfInplace",
                "SwishInplace", "IncrementModInplace"],
    "throws": ["Equal", "Greater", "And", "Or", "Not"],
    "kernel_only": ["ReluGrad", "GeluErfGrad", "SwishGrad", "TanhGrad", "ClipGrad", "PowArg0Grad",
                    "PowArg1Grad", "FmodArg1Grad", "MaxArgGrad"],
}


@pytest.mark.parametrize("kind,op_type", [(k, t) for k, ts in ELEMENTWISE_TYPES.items()
                                          for t in ts])
def test_registry_tables_complete(kind, op_type):
    load_all()
    assert op_type in KERNELS
    table = {"grad": GRAD_RULES, "no_grad": NO_GRAD, "throws": THROWS}.get(kind)
    if table is not None:
        assert op_type in table


# --- in place ---------------------------------------------------------------------------------

INPLACE = [
    ("exp_", ops.exp_, np.exp, "ExpInplace", "exp_inplace_out"),
    ("relu_", ops.relu_, lambda x: np.maximum(x, 0), "ReluInplace", "relu_inplace_out"),
    ("geluerf_", ops.geluerf_, _geluerf_ref, "GeluErfInplace", "geluerf_inplace_out"),
    ("swish_", ops.swish_, _swish_ref, "SwishInplace", "swish_inplace_out"),
    ("increment_mod_", lambda t: ops.increment_mod_(t, 1.5, 2.0), lambda x: np.fmod(x + 1.5, 2),
     "IncrementModInplace", "increment_mod_inplace_out"),
]


@pytest.mark.parametrize("name,fn,ref,op_type,out_name", INPLACE, ids=lambda v: v
                         if isinstance(v, str) else "")
@pytest.mark.parametrize("dtype", [F32, F16])
def test_inplace_modifies_its_input(name, fn, ref, op_type, out_name, dtype):
    x = _data("any", dtype, (2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(x, name="v")
        y = fn(v)
        assert (_producer(ir.main_graph, y).type, y.name) == (op_type, out_name)
        s_y = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s_y, y)
        s_v = popxl.d2h_stream(v.shape, v.dtype, "v")
        ops.host_store(s_v, v)                       # a second read of the modified input
    want = ref(x.astype(np.float32) if dtype == F16 else x)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
        stored = sess.get_tensor_data(v)
    for got in (res[s_y], res[s_v], stored):
        assert got.dtype == dtype
        np.testing.assert_allclose(got.astype(F64), want, **_tol(dtype))


@pytest.mark.parametrize("name,fn,ref,op_type,out_name", INPLACE, ids=lambda v: v
                         if isinstance(v, str) else "")
def test_inplace_on_host_loaded_tensor(name, fn, ref, op_type, out_name):
    x = _data("any", F32, (2, 3))
    y, x_after = run_ops(lambda t: (fn(t), t), x)    # second read of t after the in-place op
    np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x_after, ref(x), rtol=1e-5, atol=1e-6)


def test_increment_mod_inplace_int_counter_wraps_across_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array(0, I32), name="step")
        ops.increment_mod_(v, 1, 3)
    with popxl.Session(ir, "ipu_hw") as sess:
        seen = []
        for _ in range(4):
            sess.run()
            seen.append(int(sess.get_tensor_data(v)))
    assert seen == [1, 2, 0, 1]


def test_autodiff_refuses_modifying_inplace():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: ops.exp_(t), popxl.TensorSpec((2,), popxl.float32))
        with pytest.raises(RuntimeError, match="modifying op"):
            popxl.transforms.autodiff(g)


# --- builder errors ---------------------------------------------------------------------------

def _vars(*arrays):
    return [popxl.variable(a) for a in arrays]


ERRORS = [
    ("pow_dtype", lambda a, i: ops.pow(a, i), TypeError, "pow: inputs must have the same dtype"),
    ("fmod_dtype", lambda a, i: ops.fmod(a, i), TypeError, "fmod: inputs must have the same"),
    ("equal_dtype", lambda a, i: ops.equal(a, i), TypeError, "equal: inputs must have the same"),
    ("greater_dtype", lambda a, i: ops.greater(a, i), TypeError, "greater: inputs must"),
    ("maximum_dtype", lambda a, i: ops.maximum(a, a, i), TypeError, "maximum: inputs must"),
    ("where_dtype", lambda a, i: ops.where(i, a, i), TypeError, "where: inputs must"),
    ("pow_frac_int", lambda a, i: ops.pow(i, 0.5), TypeError, "pow: exponent 0.5 is not"),
    ("pow_bad_exp", lambda a, i: ops.pow(a, "2"), TypeError, "pow: exponent must be"),
    ("clip_tensor_min", lambda a, i: ops.clip(a, a), TypeError, "clip: 'min' must be"),
    ("incmod_zero", lambda a, i: ops.increment_mod_(a, 1, 0), ValueError, "modulus must be"),
    ("maximum_none", lambda a, i: ops.maximum(), ValueError, "maximum: needs at least one"),
    ("not_tensor", lambda a, i: ops.exp(np.ones(2)), TypeError, "exp: argument 't' must be"),
]


@pytest.mark.parametrize("name,fn,exc,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_builder_errors(name, fn, exc, match):
    ir = popxl.Ir()
    with ir.main_graph:
        a, i = _vars(np.ones((2, 3), F32), np.ones((2, 3), I32))
        with pytest.raises(exc, match=match):
            fn(a, i)


SHAPE_ERRORS = [
    ("pow", ops.pow), ("fmod", ops.fmod), ("equal", ops.equal), ("greater", ops.greater),
    ("logical_and", ops.logical_and), ("logical_or", ops.logical_or), ("maximum", ops.maximum),
    ("where", lambda a, b: ops.where(a, a, b)),
]


@pytest.mark.parametrize("name,fn", SHAPE_ERRORS, ids=[e[0] for e in SHAPE_ERRORS])
def test_non_broadcastable_shapes(name, fn):
    ir = popxl.Ir()
    with ir.main_graph:
        a, b = _vars(np.ones((2, 3), F32), np.ones((4,), F32))
        with pytest.raises(ValueError, match=f"{name}: shapes cannot be broadcast together"):
            fn(a, b)
