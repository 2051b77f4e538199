"""Reductions, argmax/argmin, topk, cumsum, histogram and lamb_square against NumPy; gradients
against finite differences (float64)."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import check_forward, check_grads, grads, numeric_grads, run_ops

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _float64_inputs(monkeypatch):
    """Let float64 host data reach float64 streams (upstream's run() downcasts it)."""
    run = popxl.Session.run
    monkeypatch.setattr(popxl.Session, "run",
                        lambda self, inputs=None, downcast_inputs=False: run(self, inputs, False))


def _lower_median(x, axis=None, keepdims=False):
    axes = tuple(range(x.ndim)) if axis is None else tuple(
        a % x.ndim for a in ([axis] if isinstance(axis, int) else axis))
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, kept + list(axes)).reshape([x.shape[i] for i in kept] + [-1])
    r = np.sort(moved, axis=-1)[..., (moved.shape[-1] - 1) // 2]
    if keepdims:
        r = r.reshape([1 if i in axes else s for i, s in enumerate(x.shape)])
    return r


def _lse(x, axis=None, keepdims=False):
    return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))


class Red(NamedTuple):
    name: str
    ref: Callable
    positive: bool = False   # needs positive inputs (log)
    ints: bool = True        # also defined on int32


REDUCTIONS = [
    Red("mean", np.mean, ints=False),
    Red("max", np.max),
    Red("min", np.min),
    Red("prod", np.prod),
    Red("median", _lower_median),
    Red("sumsquare", lambda x, axis=None, keepdims=False: np.sum(x * x, axis, keepdims=keepdims)),
    Red("l1", lambda x, axis=None, keepdims=False: np.sum(np.abs(x), axis, keepdims=keepdims)),
    Red("l2", lambda x, axis=None, keepdims=False:
        np.sqrt(np.sum(x * x, axis, keepdims=keepdims)), ints=False),
    Red("logsum", lambda x, axis=None, keepdims=False: np.log(np.sum(x, axis, keepdims=keepdims)),
        positive=True, ints=False),
    Red("logsumexp", _lse, ints=False),
]
AXES = [None, 1, -1, (0, 2), (2, 0)]


def _data(red: Red, shape, dtype=np.float32):
    x = RNG.uniform(0.5, 1.5, shape)
    if not red.positive:
        x *= RNG.choice([-1.0, 1.0], shape)
    return x.astype(dtype)


def _tuple_axis(a):
    return tuple(a) if isinstance(a, (tuple, list)) else a


@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.name)
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_matches_numpy(red, axis, keepdims):
    x = _data(red, (2, 3, 4))
    out, = run_ops(lambda t: getattr(ops, red.name)(t, axis, keepdims), x)
    want = red.ref(x.astype(np.float64), axis=_tuple_axis(axis), keepdims=keepdims)
    assert out.dtype == np.float32 and out.shape == np.shape(want)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.name)
def test_reduction_float16_accumulates_in_float32(red):
    x = _data(red, (3, 64), np.float16)
    out, = run_ops(lambda t: getattr(ops, red.name)(t, 1), x)
    want = red.ref(x.astype(np.float32), axis=1).astype(np.float16)
    assert out.dtype == np.float16
    # rounded once from float32: at most one float16 ulp away
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-3)


@pytest.mark.parametrize("red", [r for r in REDUCTIONS if r.ints], ids=lambda r: r.name)
def test_reduction_int32(red):
    x = RNG.integers(-3, 4, (3, 4)).astype(np.int32)
    out, = run_ops(lambda t: getattr(ops, red.name)(t, 0), x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, red.ref(x, axis=0))


@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.name)
@pytest.mark.parametrize("axis,keepdims", [(1, False), (None, False), ((0, 1), True)])
def test_reduction_grad_matches_finite_differences(red, axis, keepdims):
    x = _data(red, (2, 3), np.float64)
    fn = lambda t: getattr(ops, red.name)(t, axis, keepdims)  # noqa: E731
    dy = RNG.normal(size=np.shape(red.ref(x, axis=_tuple_axis(axis), keepdims=keepdims)))
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, numeric_grads(fn, [x], [dy])[0], rtol=1e-5, atol=1e-6)


def test_reduction_max_grad_goes_to_every_tie():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    _, (dx,) = grads(lambda t: ops.max(t, 1), [x], [np.array([1.0, 2.0])])
    np.testing.assert_array_equal(dx, [[0, 1, 1], [2, 0, 0]])


def test_reduction_prod_grad_with_zero():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0]])
    _, (dx,) = grads(lambda t: ops.prod(t, 1), [x], [np.array([1.0, 1.0])])
    np.testing.assert_array_equal(dx, [[0, 6, 0], [0, 0, 0]])


def test_median_second_output_is_named_and_int32():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((4, 5), np.float32), name="x")
        m = ops.median(t, 1)
        op = ir.main_graph._data.ops[-1]
    assert m.name == "median_out" and op.type == "ReduceMedian"
    second = ir.main_graph._tensor(op.outputs[1])
    assert second.name == "median_indices_out" and second.dtype == popxl.int32
    assert second.shape == (4,)


@pytest.mark.parametrize("name,ref", [("argmax", np.argmax), ("argmin", np.argmin)])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(name, ref, dim, keepdim):
    x = RNG.integers(0, 3, (3, 4)).astype(np.float32)  # ties: the first one wins
    out, = run_ops(lambda t: getattr(ops, name)(t, dim, keepdim), x)
    want = ref(x, axis=dim)
    if keepdim:
        want = np.expand_dims(want, dim)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_topk(largest, axis):
    x = RNG.permutation(24).reshape(4, 6).astype(np.float32)
    k = 2
    vals, idx = run_ops(lambda t: ops.topk(t, k, axis, largest, True), x)
    order = np.argsort(-x if largest else x, axis=axis)
    want_idx = np.take(order, np.arange(k), axis=axis)
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want_idx, axis=axis))


def test_topk_grad_scatters_to_selected():
    x = RNG.normal(size=(2, 5))
    fn = lambda t: ops.topk(t, 3, 1, True, True)[0]  # noqa: E731
    dy = RNG.normal(size=(2, 3))
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, numeric_grads(fn, [x], [dy])[0], atol=1e-6)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(dim):
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    out, = run_ops(lambda t: ops.cumsum(t, dim), x)
    np.testing.assert_allclose(out, np.cumsum(x, axis=dim), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dim", [0, 1])
def test_cumsum_grad(dim):
    x = RNG.normal(size=(2, 3))
    fn = lambda t: ops.cumsum(t, dim)  # noqa: E731
    dy = RNG.normal(size=(2, 3))
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, numeric_grads(fn, [x], [dy])[0], atol=1e-6)


@pytest.mark.parametrize("absolute", [False, True])
def test_histogram(absolute):
    x = np.array([-2.0, -0.5, 0.0, 0.25, 0.5, 0.9, 1.0, 3.0], np.float32)
    levels = [0.0, 0.5, 1.0]
    out, = run_ops(lambda t: ops.histogram(t, levels, absolute), x)
    v = np.abs(x) if absolute else x
    want = [np.sum(v < 0.0), np.sum((v >= 0) & (v < 0.5)), np.sum((v >= 0.5) & (v < 1.0)),
            np.sum(v >= 1.0)]
    assert out.dtype == np.uint32
    np.testing.assert_array_equal(out, want)


def test_lamb_square():
    x = RNG.normal(size=(3, 5)).astype(np.float16)
    out, = run_ops(ops.lamb_square, x)
    assert out.dtype == np.float32 and out.shape == ()
    np.testing.assert_allclose(out, np.sum(x.astype(np.float64) ** 2), rtol=1e-6)


def test_op_types_and_names():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((2, 3), np.float32), name="x")
        made = {
            "ReduceMean": ops.mean(t), "ReduceMax": ops.max(t), "ReduceMin": ops.min(t),
            "ReduceProd": ops.prod(t), "ReduceSumSquare": ops.sumsquare(t),
            "ReduceL1": ops.l1(t), "ReduceL2": ops.l2(t), "ReduceLogSum": ops.logsum(t),
            "ReduceLogSumExp": ops.logsumexp(t), "ArgMax": ops.argmax(t),
            "ArgMin": ops.argmin(t), "TopK": ops.topk(t, 1, 0, True, True)[0],
            "CumSum": ops.cumsum(t), "Histogram": ops.histogram(t, [0.0], False),
            "LambSquare": ops.lamb_square(t),
        }
        types = [op.type for op in ir.main_graph._data.ops]
    assert list(made) == types
    assert made["ReduceMean"].name == "mean_out" and made["ArgMax"].dtype == popxl.int32


ERRORS = [
    (lambda t: ops.mean(t, 2), ValueError, "axis 2 is out of range"),
    (lambda t: ops.max(t, [0, 0]), ValueError, "repeated axis"),
    (lambda t: ops.argmax(t, 3), ValueError, "argmax: axis 3 is out of range"),
    (lambda t: ops.argmin(t, 0.5), TypeError, "argmin: the axis must be an int"),
    (lambda t: ops.topk(t, 4, 1, True, True), ValueError, r"topk: k=4 must be in \[1, 3\]"),
    (lambda t: ops.histogram(t, [1.0, 0.0], False), ValueError,
     r"^The input levels `\[1.0, 0.0\]` is not a monotonically increasing list"),
    (lambda t: ops.sum(t, axis="10"), TypeError, "axis must be an int or a sequence of ints"),
    (lambda t: ops.mean(t, axis=1.0), TypeError, "axis must be an int or a sequence of ints"),
    (lambda t: ops.l2(ops.cast(t, popxl.int32)), TypeError, "l2: .* must be a floating point"),
    (lambda t: ops.histogram(ops.cast(t, popxl.int32), [0.0], False), TypeError,
     "histogram: .* must be float16 or float32"),
    (lambda t: ops.mean(np.ones(3)), TypeError,
     r"^The input `t` is not a Tensor. Type: <class 'numpy.ndarray'>.*\(mean: argument 't' "
     r"must be a popxl.Tensor\)"),
]


@pytest.mark.parametrize("fn,exc,match", ERRORS)
def test_builder_errors(fn, exc, match):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((2, 3), np.float32), name="x")
        with pytest.raises(exc, match=match):
            fn(t)


# --- sum -----------------------------------------------------------------------------------------
SUMS = [
    ("sum_all", ops.sum, np.sum, [(2, 3)]),
    ("sum_axis_keep", lambda a: ops.sum(a, 1, keepdims=True), lambda a: a.sum(1, keepdims=True),
     [(2, 3, 4)]),
    ("sum_neg_axes", lambda a: ops.sum(a, [-1, 0]), lambda a: a.sum((0, 2)), [(2, 3, 4)]),
]
POSITIVE: dict = {}


@pytest.mark.parametrize("name,fn,ref,shapes", SUMS, ids=[r[0] for r in SUMS])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sum_forward_matches_numpy(name, fn, ref, shapes, dtype):
    check_forward(fn, ref, shapes, dtype, positive=POSITIVE.get(name, ()))


@pytest.mark.parametrize("name,fn,ref,shapes", SUMS, ids=[r[0] for r in SUMS])
def test_sum_gradients_match_finite_differences(name, fn, ref, shapes):
    check_grads(fn, ref, shapes, positive=POSITIVE.get(name, ()))
