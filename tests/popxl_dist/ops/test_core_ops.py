"""Core ops (arith, matmul, shape views, sum, gelu, softmax, fused NLL, scaled_add, cast) against
NumPy, and their gradients against finite differences."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import grads, numeric_grads, run_ops

rng = np.random.default_rng(0)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# (name, builder, numpy reference, input shapes)
FORWARD = [
    ("add_broadcast", lambda a, b: a + b, lambda a, b: a + b, [(2, 3), (3,)]),
    ("sub", ops.sub, np.subtract, [(2, 3), (2, 1)]),
    ("mul", ops.mul, np.multiply, [(2, 3), (1, 3)]),
    ("div", ops.div, np.divide, [(2, 3), (2, 3)]),
    ("negate", ops.negate, np.negative, [(4,)]),
    ("matmul_2d", ops.matmul, np.matmul, [(2, 3), (3, 4)]),
    ("matmul_batched", ops.matmul, np.matmul, [(2, 2, 3), (3, 4)]),
    ("matmul_vec", ops.matmul, np.matmul, [(3,), (3, 2)]),
    ("matmul_matvec", ops.matmul, np.matmul, [(2, 3), (3,)]),
    ("reshape", lambda a: a.reshape((3, -1)), lambda a: a.reshape(3, -1), [(2, 3)]),
    ("flatten", ops.flatten, lambda a: a.reshape(-1), [(2, 3)]),
    ("transpose", lambda a: a.transpose((1, 2, 0)), lambda a: a.transpose(1, 2, 0), [(2, 3, 4)]),
    ("T", lambda a: a.T, lambda a: a.T, [(2, 3)]),
    ("sum_all", ops.sum, np.sum, [(2, 3)]),
    ("sum_axis_keep", lambda a: ops.sum(a, 1, keepdims=True), lambda a: a.sum(1, keepdims=True),
     [(2, 3, 4)]),
    ("sum_neg_axes", lambda a: ops.sum(a, [-1, 0]), lambda a: a.sum((0, 2)), [(2, 3, 4)]),
    ("gelu", ops.gelu, _gelu, [(3, 4)]),
    ("softmax", lambda a: ops.softmax(a, -1), lambda a: _softmax(a, -1), [(3, 5)]),
    ("softmax_axis0", lambda a: ops.softmax(a, 0), lambda a: _softmax(a, 0), [(3, 5)]),
    ("scaled_add", lambda a, b: ops.scaled_add(a, b, 0.5, -2.0), lambda a, b: 0.5 * a - 2 * b,
     [(2, 3), (2, 3)]),
    ("identity", ops.identity, lambda a: a, [(2,)]),
]


@pytest.mark.parametrize("name,fn,ref,shapes", FORWARD, ids=[r[0] for r in FORWARD])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_forward_matches_numpy(name, fn, ref, shapes, dtype):
    arrays = [rng.normal(size=s).astype(dtype) for s in shapes]
    if name == "div":
        arrays[1] = (np.abs(arrays[1]) + 0.5).astype(dtype)
    out, = run_ops(fn, *arrays)
    want = ref(*[a.astype(np.float64) for a in arrays])
    assert out.dtype == dtype
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol)


GRADS = [r for r in FORWARD if r[0] not in ("scaled_add",)]


@pytest.mark.parametrize("name,fn,ref,shapes", GRADS, ids=[r[0] for r in GRADS])
def test_gradients_match_finite_differences(name, fn, ref, shapes):
    arrays = [rng.normal(size=s) for s in shapes]
    if name == "div":
        arrays[1] = np.abs(arrays[1]) + 0.5
    out_shape = np.shape(ref(*arrays))
    dy = rng.normal(size=out_shape)
    _, got = grads(fn, arrays, [dy])
    want = numeric_grads(fn, arrays, [dy])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 2])
def test_nll_loss_with_softmax_grad(reduction, ignore_index):
    logits = rng.normal(size=(6, 5)).astype(np.float32)
    labels = np.array([0, 2, 4, 2, 1, 3], np.int32)
    probs = _softmax(logits.astype(np.float64), -1)

    def fn(p, lab):
        return ops.nll_loss_with_softmax_grad(p, lab, loss_grad=3.0, ignore_index=ignore_index,
                                              reduction=reduction)

    loss, dx = run_ops(fn, probs.astype(np.float32), labels)
    valid = np.ones(6, bool) if ignore_index is None else labels != ignore_index
    per = np.where(valid, -np.log(probs[np.arange(6), labels] + 1e-7), 0)
    onehot = np.eye(5)[labels]
    grad = (probs - onehot) * 3.0 * valid[:, None]
    if reduction == "mean":
        want_loss, grad = per.sum() / valid.sum(), grad / valid.sum()
    elif reduction == "sum":
        want_loss = per.sum()
    else:
        want_loss = per
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dx, grad, rtol=1e-5, atol=1e-6)


def test_scaled_add_inplace_with_tensor_coefficients_and_mixed_dtypes():
    def fn(x, y, b):
        ops.scaled_add_(x, y, a=2.0, b=b)
        return x

    x = rng.normal(size=(2, 3)).astype(np.float32)
    y = rng.normal(size=(2, 3)).astype(np.float16)
    b = np.array(-0.5, np.float32)
    out, = run_ops(fn, x, y, b)
    np.testing.assert_allclose(out, 2 * x - 0.5 * y.astype(np.float32), rtol=1e-6)


def test_cast_truncates_toward_zero():
    out, = run_ops(lambda a: ops.cast(a, popxl.int32), np.array([-1.7, 1.7, 2.5], np.float32))
    np.testing.assert_array_equal(out, [-1, 1, 2])


def test_matmul_float16_accumulates_in_float32():
    a = np.full((1, 4096), 1.0, np.float16)
    b = np.full((4096, 1), 1.0 / 3, np.float16)
    out, = run_ops(ops.matmul, a, b)
    want = np.float16(4096 * np.float32(np.float16(1 / 3)))
    assert out[0, 0] == want
