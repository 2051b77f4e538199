"""var_updates: every update against a NumPy reference (constant and tensor scalars, mixed
precision), the Adam tutorial's exact one-step result, op types, names, in-place effects, errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import grads, run_ops

vu = ops.var_updates
F16, F32 = np.float16, np.float32


def _ref(t, X, fn, coef=()):
    """Reference of the documented numerics: X rounded into t's dtype, coefficients in float32,
    computed in float32 (float64 for float64 t), rounded once into t."""
    calc = np.float64 if t.dtype == np.float64 else np.float32
    x = X.astype(t.dtype).astype(calc)
    cs = [np.asarray(c, dtype=calc if calc == np.float64 else np.float32)[()] for c in coef]
    return fn(t.astype(calc), x, *cs).astype(t.dtype)


# (name, builder(t, X, f), reference(t, x, f) in the compute dtype, f value)
ACCUMULATE = [
    ("add", lambda t, X, f: vu.accumulate_(t, X), lambda t, x, f: t + x, None),
    ("dampened", lambda t, X, f: vu.accumulate_(t, X, f), lambda t, x, f: t + f * x, 0.3),
    ("square", lambda t, X, f: vu.accumulate_square_(t, X, f), lambda t, x, f: t + f * x * x, 0.7),
    ("mean", lambda t, X, f: vu.accumulate_mean_(t, X, f),
     lambda t, x, f: (f / (f + 1)) * t + (1 / (f + 1)) * x, 3.0),
    ("moving_average", lambda t, X, f: vu.accumulate_moving_average_(t, X, f),
     lambda t, x, f: f * t + (1 - f) * x, 0.9),
    ("moving_average_square", lambda t, X, f: vu.accumulate_moving_average_square_(t, X, f),
     lambda t, x, f: f * t + (1 - f) * x * x, 0.99),
]


ACC_CASES = [pytest.param(*r, tf, id=f"{r[0]}-{'tensor' if tf else 'const'}_f")
             for r in ACCUMULATE for tf in (False, True) if not (tf and r[3] is None)]


@pytest.mark.parametrize("t_dt,x_dt", [(F32, F32), (F16, F32), (F32, F16), (F16, F16)])
@pytest.mark.parametrize("name,build,ref,f,tensor_f", ACC_CASES)
def test_accumulate_matches_numpy(name, build, ref, f, tensor_f, t_dt, x_dt):
    rng = np.random.default_rng(0)
    t = rng.normal(size=(3, 4)).astype(t_dt)
    X = rng.normal(size=(3, 4)).astype(x_dt)
    if tensor_f:
        out, = run_ops(lambda a, b, c: build(a, b, c), t, X, np.array(f, F32))
    else:
        out, = run_ops(lambda a, b: build(a, b, f), t, X)
    want = _ref(t, X, lambda a, b, *c: ref(a, b, c[0] if c else None),
                () if f is None else (f,))
    assert out.dtype == t_dt
    tol = 1e-3 if t_dt == F16 else 1e-6
    np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_accumulate_op_structure_matches_seed_schedule():
    ir = popxl.Ir()
    with ir.main_graph:
        m = popxl.variable(np.zeros((2, 2)), popxl.float16, "first_order")
        g = popxl.variable(np.zeros((2, 2)), popxl.float32, "grad")
        lr = popxl.variable(np.zeros(()), popxl.float32, "lr")
        a = vu.accumulate_moving_average_(m, g, f=0.9)
        b = vu.accumulate_moving_average_(m, g, f=lr)
        ops_ = ir.main_graph._data.ops
    assert [o.type for o in ops_] == ["Accumulate", "Accumulate"]
    assert len(ops_[0].inputs) == 2 and len(ops_[1].inputs) == 3
    assert a.name == "accumulate__first_order" and a.dtype == popxl.float16
    assert b.name.startswith("accumulate__first_order")


def test_accumulator_scale_and_zero():
    t = np.array([[1.0, np.nan], [np.inf, -2.0]], F32)
    out, = run_ops(lambda a: vu.accumulator_zero_(a), t)
    np.testing.assert_array_equal(out, np.zeros_like(t))
    t = np.array([[1.0, 3.0], [-4.0, 2.0]], F16)
    out, = run_ops(lambda a: vu.accumulator_scale_(a, 0.5), t)
    np.testing.assert_array_equal(out, (t.astype(F32) * F32(0.5)).astype(F16))
    out, = run_ops(lambda a, f: vu.accumulator_scale_(a, f), t, np.array(-2.0, F32))
    np.testing.assert_array_equal(out, (t.astype(F32) * -2).astype(F16))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("f", [None, 0.5])
def test_sparse_accumulate_matches_numpy(axis, f):
    rng = np.random.default_rng(1)
    t = rng.normal(size=(4, 5)).astype(F32)
    idx = np.array([1, 3, 1], np.int32)
    xshape = (3, 5) if axis == 0 else (4, 3)
    X = rng.normal(size=xshape).astype(F32)
    out, = run_ops(lambda a, b, i: vu.sparse_accumulate_(a, b, i, axis=axis, f=f), t, X, idx)
    want = t.copy()
    for j, k in enumerate(idx):
        if axis == 0:
            want[k] += (1.0 if f is None else f) * X[j]
        else:
            want[:, k] += (1.0 if f is None else f) * X[:, j]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_sparse_accumulate_adds_repeated_rows_in_index_order():
    """Bit for bit a sequential loop, with rows repeated hundreds of times."""
    rng = np.random.default_rng(5)
    t = rng.normal(size=(6, 3)).astype(F32)
    idx = np.minimum(rng.geometric(0.3, 900) - 1, 5).astype(np.int32)
    X = (rng.normal(size=(900, 3)) * 10.0 ** rng.integers(-4, 4, (900, 3))).astype(F32)
    out, = run_ops(lambda a, b, i: vu.sparse_accumulate_(a, b, i, axis=0), t, X, idx)
    want = t.copy()
    for j, k in enumerate(idx):
        want[k] = want[k] + X[j]
    assert out.tobytes() == want.tobytes()


def test_copy_var_update_persists_on_a_variable():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3)), popxl.float32, "v")
        x = popxl.constant(np.arange(6.0).reshape(2, 3), popxl.float32)
        u = vu.copy_var_update_(v, x)
        assert u.name == "updated__v"
        assert ir.main_graph._data.ops[-1].type == "CopyVarUpdate"
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        np.testing.assert_array_equal(s.get_tensor_data(v), np.arange(6.0).reshape(2, 3))


def _adam_ref(m, v, w, step, b1, b2, eps, wd, mode="adam"):
    m, v, w = (a.astype(np.float64) for a in (m, v, w))
    t = step + 1
    if b1 is not None:
        m = m / (1 - b1 ** t)
        if mode != "adamax":
            v = v / (1 - b2 ** t)
    x = m / (v + eps) if mode == "adamax" else m / (np.sqrt(v) + eps)
    return x + wd * w


@pytest.mark.parametrize("mode", ["adam", "lamb", "adamax"])
@pytest.mark.parametrize("wd", [0.0, 0.01, "tensor"])
def test_updaters_match_numpy_and_increment_step(mode, wd):
    rng = np.random.default_rng(2)
    m = rng.normal(size=(2, 3)).astype(F32)
    v = rng.random(size=(2, 3)).astype(F32)
    w = rng.normal(size=(2, 3)).astype(F32)
    step = np.array(4.0, F32)
    wd_val = 0.02 if wd == "tensor" else wd

    def fn(m_, v_, w_, s_, wd_):
        kw = dict(weight=w_, time_step=s_, beta1=0.9, epsilon=1e-5,
                  weight_decay=wd_ if wd == "tensor" else wd)
        if mode == "adamax":
            x = vu.adamax_updater(m_, v_, **kw)
        else:
            x = getattr(vu, f"{mode}_updater")(m_, v_, beta2=0.999, **kw)
        return x, s_

    x, s = run_ops(fn, m, v, w, step, np.array(wd_val, F32))
    np.testing.assert_allclose(x, _adam_ref(m, v, w, 4.0, 0.9, 0.999, 1e-5, wd_val, mode),
                               rtol=1e-5)
    assert s == 5.0


def test_adam_updater_without_bias_correction_and_dtypes():
    m = np.full((2,), 0.5, F16)
    v = np.full((2,), 0.25, F32)
    x, = run_ops(lambda a, b: vu.adam_updater(a, b), m, v)
    assert x.dtype == F16
    np.testing.assert_allclose(x.astype(F32), 0.5 / (0.5 + 1e-7), rtol=1e-3)


def test_adam_updater_input_layout_matches_seed_schedule():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2)), popxl.float32, "w")
        m = popxl.variable(np.zeros((2, 2)), popxl.float16, "m")
        v = popxl.variable(np.zeros((2, 2)), popxl.float32, "v")
        s = popxl.variable(np.zeros(()), popxl.float32, "step")
        x = vu.adam_updater(m, v, weight=w, weight_decay=0.0, time_step=s, beta1=0.9, beta2=0.999)
        y = vu.adam_updater(m, v, weight=w, weight_decay=0.1, time_step=s, beta1=0.9, beta2=0.999)
        op0, op1 = ir.main_graph._data.ops
    assert op0.type == "AdamUpdater" and op0.inputs == (m.id, v.id, s.id)
    assert x.name == "Updater" and x.dtype == popxl.float16
    assert op1.inputs == (w.id, m.id, v.id, s.id) and y.dtype == popxl.float32


def test_adam_tutorial_one_step_is_exact():
    """The seed tutorial's Adam step (popxl_addons Adam module, written with ops directly)."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2)), popxl.float32, "w")
        grad = popxl.variable(np.full((2, 2), 0.1), popxl.float32, "grad")
        m = popxl.variable(np.zeros((2, 2)), popxl.float16, "first_order")
        v = popxl.variable(np.zeros((2, 2)), popxl.float32, "second_order")
        step = popxl.variable(np.zeros(()), popxl.float32, "step")
        vu.accumulate_moving_average_(m, grad, f=0.9)
        vu.accumulate_moving_average_square_(v, grad, f=0.999)
        dw = vu.adam_updater(m, v, weight=w, weight_decay=0.0, time_step=step, beta1=0.9,
                             beta2=0.999, epsilon=1e-5)
        ops.scaled_add_(w, dw, b=-1e-3)
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        got_m, got_v, got_step, got_w = (s.get_tensor_data(t) for t in (m, v, step, w))
    assert got_m.dtype == F16 and str(got_m[0, 0]) == "0.009995"
    np.testing.assert_array_equal(got_m, np.full((2, 2), 0.009995, F16))
    assert str(got_v[0, 0]) == "9.9998715e-06"
    np.testing.assert_array_equal(got_v, np.full((2, 2), 9.9998715e-06, F32))
    assert got_step == 1.0
    x = _adam_ref(got_m, got_v, np.ones((2, 2)), 0.0, 0.9, 0.999, 1e-5, 0.0)
    want_w = np.float32(1) - np.float32(1e-3) * x.astype(F16).astype(F32)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6)


@pytest.mark.parametrize("r1,r2,mwn,ratio", [(4.0, 1.0, None, 2.0), (4.0, 1.0, 1.5, 1.5),
                                             (0.0, 1.0, None, 1.0), (4.0, 0.0, None, 1.0)])
def test_adam_var_update_trust_ratio(r1, r2, mwn, ratio):
    t = np.array([1.0, 2.0], F32)
    x = np.array([0.5, -1.0], F32)
    out, = run_ops(lambda a, b, c, d, lr: vu.adam_var_update(a, b, c, d, learning_rate=lr,
                                                             max_weight_norm=mwn),
                   t, x, np.array(r1, F32), np.array(r2, F32), np.array(0.1, F32))
    np.testing.assert_allclose(out, t - 0.1 * ratio * x, rtol=1e-6)


def test_var_updates_are_not_differentiable():
    with pytest.raises(RuntimeError, match="modifying op"):
        grads(lambda a, b: vu.accumulate_(a, b), [np.ones(2), np.ones(2)], [np.ones(2)])


@pytest.mark.parametrize("build,err,match", [
    (lambda t, X, i: vu.accumulate_(t, i), ValueError, "same shape"),
    (lambda t, X, i: vu.accumulate_(t, X, f="x"), TypeError, "float or a scalar Tensor"),
    (lambda t, X, i: vu.accumulate_(t, X, f=X), ValueError, "scalar tensor"),
    (lambda t, X, i: vu.copy_var_update_(t, ops.cast(X, popxl.float16)), TypeError, "same dtype"),
    (lambda t, X, i: vu.adam_updater(t, X, weight_decay=0.1), ValueError,
     "^Weight decay requires weight to not be None"),
    (lambda t, X, i: vu.adam_updater(t, X, time_step=i), ValueError, "beta1"),
    (lambda t, X, i: vu.adamax_updater(t, X), ValueError, "time_step"),
])
def test_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3)), popxl.float32, "t")
        X = popxl.variable(np.zeros((2, 3)), popxl.float32, "X")
        i = popxl.variable(np.zeros((4,)), popxl.int32, "i")
        with pytest.raises(err, match=match):
            build(t, X, i)


@pytest.mark.parametrize("axis,x_shape,why", [
    (0, (2, 3), r"'X' 'X' must have shape \(4, 3\) \(t \(2, 3\) with axis 0 replaced by "
                r"indices \(4,\)\), got \(2, 3\)"),
    (2, (2, 4), r"axis 2 is out of range for 't' 't' \(2, 3\)"),
])
def test_sparse_accumulate_setups_upstream_builds_are_refused_by_the_session(axis, x_shape,
                                                                             why):
    """As upstream, sparse_accumulate_ builds with an axis out of range or an X not shaped
    like the gather; the Session refuses it, naming the op (its axis is kept as given)."""
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3)), popxl.float32, "t")
        X = popxl.variable(np.zeros(x_shape), popxl.float32, "X")
        i = popxl.variable(np.zeros((4,)), popxl.int32, "i")
        vu.sparse_accumulate_(t, X, i, axis=axis)
    assert ir.main_graph._pb_graph.getOps()[0].getAxis() == axis
    with pytest.raises(ValueError, match=rf"^Session: SparseAccumulate\.\d+ .*: {why} \(the op "
                                         rf"builds, as upstream, but cannot compile\)$"):
        popxl.Session(ir, "cpu")


# --- integer accumulators (upstream accepts them: e.g. accumulate_(int32, int32 variable)) ----
def _int_ref(t, X, fn, f):
    """Exact integer add for plain accumulate; scaled updates in float64, truncated to t."""
    r = fn(t.astype(np.float64), X.astype(t.dtype).astype(np.float64), f)
    return np.trunc(r).astype(t.dtype)


@pytest.mark.parametrize("t_dt", [np.int32, np.uint32, np.int8])
@pytest.mark.parametrize("name,build,ref,f,tensor_f", ACC_CASES)
def test_accumulate_integer_accumulators(name, build, ref, f, tensor_f, t_dt):
    rng = np.random.default_rng(3)
    lo = 0 if np.dtype(t_dt).kind == "u" else -20
    t = rng.integers(lo, 20, size=(3, 4)).astype(t_dt)
    X = rng.integers(lo, 20, size=(3, 4)).astype(t_dt)
    if tensor_f:
        out, = run_ops(lambda a, b, c: build(a, b, c), t, X, np.array(f, F32))
    else:
        out, = run_ops(lambda a, b: build(a, b, f), t, X)
    assert out.dtype == t_dt
    if f is None:
        np.testing.assert_array_equal(out, t + X)
    else:
        # a constant f is used as given (float64); a tensor f carries its float32 value
        fv = np.float64(np.float32(f)) if tensor_f else np.float64(f)
        np.testing.assert_array_equal(out, _int_ref(t, X, ref, fv))


def test_integer_add_wraps_like_int32_and_mixed_dtypes_round_into_t():
    big = np.array([2 ** 31 - 1, -5], np.int32)
    out, = run_ops(lambda a, b: vu.accumulate_(a, b), big, np.array([1, 2], np.int32))
    np.testing.assert_array_equal(out, np.array([-2 ** 31, -3], np.int32))
    t = np.array([1, 2, 3], np.int32)
    out, = run_ops(lambda a, b: vu.accumulate_(a, b), t, np.array([0.9, -1.7, 2.5], F32))
    np.testing.assert_array_equal(out, t + np.array([0, -1, 2], np.int32))   # X -> int32 first


@pytest.mark.parametrize("f,want", [(0.5, [0, 1, -1, 3]), (0.0, [0, 0, 0, 0]),
                                    (2.0, [2, 4, -6, 14])])
def test_accumulator_scale_and_zero_on_int(f, want):
    t = np.array([1, 2, -3, 7], np.int32)
    out, = run_ops(lambda a: vu.accumulator_scale_(a, f), t)
    np.testing.assert_array_equal(out, np.array(want, np.int32))
    out, = run_ops(lambda a: vu.accumulator_zero_(a), t)
    np.testing.assert_array_equal(out, np.zeros(4, np.int32))


def test_sparse_accumulate_and_copy_var_update_on_int():
    t = np.zeros((4, 2), np.int32)
    X = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    idx = np.array([0, 3, 0], np.int32)
    out, = run_ops(lambda a, b, i: vu.sparse_accumulate_(a, b, i), t, X, idx)
    want = t.copy()
    np.add.at(want, idx, X)
    np.testing.assert_array_equal(out, want)
    out, = run_ops(lambda a, b: vu.copy_var_update_(a, b), t, X[:2].repeat(2, 0))
    np.testing.assert_array_equal(out, X[:2].repeat(2, 0))


def test_bool_accumulator_is_refused():
    with pytest.raises(TypeError, match="accumulate_: 't' .* must have a numeric"):
        run_ops(lambda a, b: vu.accumulate_(a, b), np.array([True]), np.array([True]))
