"""NN ops: group/layer/batch norm, nll_loss and the fused nll_loss_with_softmax_grad against NumPy
references written here, gradients against finite differences (float64), op types and builder
errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import grads, numeric_grads, run_ops

F16, F32, F64 = np.float16, np.float32, np.float64


def _group_norm_ref(x, w, b, groups, eps):
    n = x.shape[0]
    xg = x.reshape(n, groups, -1).astype(F64)
    mean = xg.mean(axis=2, keepdims=True)
    var = xg.var(axis=2, keepdims=True)          # biased
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    cs = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return y * w.reshape(cs) + b.reshape(cs)


def _bn_ref(x, s, b, m, v, eps):
    cs = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return s.reshape(cs) * (x - m.reshape(cs)) / np.sqrt(v.reshape(cs) + eps) + b.reshape(cs)


# (name, builder, reference, input shapes) for the normalisations.
NORMS = [
    ("group_norm_2groups", lambda x, w, b: ops.group_norm(x, w, b, 2, eps=1e-3),
     lambda x, w, b: _group_norm_ref(x, w, b, 2, 1e-3), [(2, 4, 3), (4,), (4,)]),
    ("group_norm_4d", lambda x, w, b: ops.group_norm(x, w, b, 3),
     lambda x, w, b: _group_norm_ref(x, w, b, 3, 1e-5), [(2, 3, 2, 2), (3,), (3,)]),
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b),
     lambda x, w, b: _group_norm_ref(x, w, b, 1, 1e-5), [(3, 4, 2), (4,), (4,)]),
    ("layer_norm_2d", lambda x, w, b: ops.layer_norm(x, w, b, eps=1e-2),
     lambda x, w, b: _group_norm_ref(x, w, b, 1, 1e-2), [(2, 3), (3,), (3,)]),
    ("batch_norm_inference",
     lambda x, s, b, m, v: ops.batch_norm_inference(x, s, b, m, v, epsilon=1e-3),
     lambda x, s, b, m, v: _bn_ref(x, s, b, m, v, 1e-3), [(2, 3, 2), (3,), (3,), (3,), (3,)]),
]


def _inputs(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrs = [rng.normal(size=s).astype(dtype) for s in shapes]
    if len(arrs) == 5:
        arrs[4] = (np.abs(arrs[4]) + 0.5).astype(dtype)       # a positive variance
    return arrs


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("name,build,ref,shapes", NORMS, ids=[r[0] for r in NORMS])
def test_norms_match_numpy(name, build, ref, shapes, dtype):
    arrs = _inputs(shapes, dtype)
    out, = run_ops(build, *arrs)
    assert out.dtype == dtype and out.shape == shapes[0]
    tol = 5e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(out, ref(*(a.astype(F64) for a in arrs)), rtol=tol, atol=tol)


def test_group_norm_three_groups_keyword_arguments():
    x, w, b = _inputs([(2, 6, 5), (6,), (6,)], F32, seed=3)
    out, = run_ops(lambda *t: ops.group_norm(*t, num_groups=3, eps=1e-4), x, w, b)
    want = _group_norm_ref(x, w.astype(F64), b.astype(F64), 3, 1e-4)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,build,ref,shapes", NORMS, ids=[r[0] for r in NORMS])
def test_norm_grads_match_finite_differences(name, build, ref, shapes):
    arrs = _inputs(shapes, F64, seed=5)
    dy = np.random.default_rng(6).normal(size=shapes[0])
    _, got = grads(build, arrs, [dy])
    want = numeric_grads(build, arrs, [dy])
    assert len(got) == len(arrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_group_norm_op_structure():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4, 3)), popxl.float32, "x")
        w = popxl.variable(np.ones((4,)), popxl.float32, "w")
        b = popxl.variable(np.zeros((4,)), popxl.float32, "b")
        y = ops.group_norm(x, w, b, 2)
        op = ir.main_graph._data.ops[-1]
    assert op.type == "GroupNormalization" and len(op.outputs) == 3
    assert op.outputs[0] == y.id
    assert [ir.main_graph._data.tensors[t].shape for t in op.outputs[1:]] == [(4,), (4,)]


def _nll_ref(p, lab, ignore, reduction, log_prob):
    eps = 6.104e-5 if p.dtype == F16 else 1e-7
    pf = p.reshape(-1, p.shape[-1]).astype(F64)
    lf = lab.reshape(-1)
    valid = np.ones(lf.shape, bool) if ignore is None else lf != ignore
    picked = pf[np.arange(lf.size), np.where(valid, lf, 0)]
    loss = -picked if log_prob else -np.log(np.maximum(picked, eps))
    loss = np.where(valid, loss, 0)
    if reduction == "none":
        return loss.reshape(lab.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / max(valid.sum(), 1)


NLL_CASES = [
    ("mean", None, False), ("sum", None, False), ("none", None, False),
    ("mean", 2, False), ("none", 1, False), ("mean", None, True), ("sum", 0, True),
]


def _probs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    e = np.exp(rng.normal(size=shape))
    return (e / e.sum(axis=-1, keepdims=True)).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("reduction,ignore,log_prob", NLL_CASES)
def test_nll_loss_matches_numpy(reduction, ignore, log_prob, dtype):
    p = _probs((2, 3, 4), dtype)
    p[0, 0, 1] = 0                                  # clamped by eps
    lab = np.array([[1, 2, 3], [2, 0, 2]], np.int32)
    out, = run_ops(lambda a, b: ops.nll_loss(a, b, ignore, reduction, log_prob), p, lab)
    want = _nll_ref(p, lab, ignore, reduction, log_prob)
    assert out.shape == np.shape(want) and out.dtype == dtype
    tol = 2e-3 if dtype == F16 else 1e-6
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("reduction,ignore,log_prob", NLL_CASES)
def test_nll_loss_grad_matches_finite_differences(reduction, ignore, log_prob):
    p = _probs((3, 4), F64, seed=1)
    lab = np.array([2, 0, 2], np.int32)
    fn = lambda a, b: ops.nll_loss(a, b, ignore, reduction, log_prob)  # noqa: E731
    dy = np.array(1.5) if reduction != "none" else np.array([0.5, -1.0, 2.0])
    _, got = grads(fn, [p, lab], [dy])
    want = numeric_grads(fn, [p, lab], [dy])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)


def test_float16_batch_norm_rounds_the_float32_result_once():
    # values down to float16's subnormal range: the fast float16 converters give NumPy's bits
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(2, 3, 4, 5)) * np.exp2(rng.integers(-22, 4, size=(2, 3, 4, 5))))
    s, b, m = (rng.normal(size=3) * 1e-3 for _ in range(3))
    v = np.abs(rng.normal(size=3)) + 0.5
    arrs16 = [a.astype(F16) for a in (x, s, b, m, v)]
    build = lambda *t: ops.batch_norm_inference(*t, epsilon=1e-3)  # noqa: E731
    y16, = run_ops(build, *arrs16)
    a32 = [a.astype(F32) for a in arrs16]
    k = a32[1] / np.sqrt(a32[4] + F32(1e-3))
    cs = (1, 3, 1, 1)
    want = ((a32[0] - a32[3].reshape(cs)) * k.reshape(cs) + a32[2].reshape(cs)).astype(F16)
    assert y16.dtype == F16
    np.testing.assert_array_equal(y16.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, s, lab: ops.group_norm(x, w, w, 3), ValueError, "num_groups 3"),
    (lambda x, w, s, lab: ops.layer_norm(x, x, x), ValueError, r"must have shape \(4,\)"),
    (lambda x, w, s, lab: ops.layer_norm(x, ops.cast(w, popxl.float16), w), TypeError,
     "same dtype"),
    (lambda x, w, s, lab: ops.batch_norm_inference(x, w, w, w, x), ValueError, "var"),
    (lambda x, w, s, lab: ops.nll_loss(x, lab, reduction="avg"), ValueError, "reduction"),
    (lambda x, w, s, lab: ops.nll_loss(x, x), TypeError, "integer class ids"),
    (lambda x, w, s, lab: ops.nll_loss(w, lab), ValueError, "do not match"),
])
def test_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4)), popxl.float32, "x")
        w = popxl.variable(np.zeros((4,)), popxl.float32, "w")
        s = popxl.variable(np.array([1, 2], np.uint32), popxl.uint32, "s")
        lab = popxl.variable(np.zeros((2,)), popxl.int32, "lab")
        with pytest.raises(err, match=match):
            build(x, w, s, lab)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 2])
def test_nll_loss_with_softmax_grad(reduction, ignore_index):
    logits = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
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
