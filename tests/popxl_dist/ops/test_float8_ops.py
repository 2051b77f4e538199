"""float8 ops: pow2scale casts, matmul_pow2scaled, conv_pow2scaled, conv_transpose_pow2scaled
against NumPy references (tests/references.py) on the decoded values, their gradients, and
their errors.

float8 data on the host (stream inputs and outputs) is arrays of the structured float8 dtypes,
as upstream."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.fp8_utils import host_pow2scale_cast_from_fp8 as dec
from popxl.fp8_utils import host_pow2scale_cast_to_fp8 as enc

import references as ref
from harness import run_ops

F8 = {"143": popxl.float8_143, "152": popxl.float8_152}
NP8 = {popxl.float8_143: popxl.dtypes.np_dtype_float8_143,
       popxl.float8_152: popxl.dtypes.np_dtype_float8_152}


def fp8_array(x, dtype, log2_scale=0):
    """Host values `x` cast to `dtype` (float8 host data: a structured float8 array)."""
    data = enc(x, dtype, log2_scale)
    assert data.dtype == NP8[dtype]
    return data


def values(data, log2_scale=0):
    """float32 values of float8 host data."""
    return dec(data, popxl.float32, log2_scale)


def scale(s):
    return np.array(s, np.int32)


@pytest.mark.parametrize("src", [np.float16, np.float32])
@pytest.mark.parametrize("fmt", ["143", "152"])
@pytest.mark.parametrize("s", [-4, 0, 5])
def test_pow2scale_casts_match_host_casts(src, fmt, s):
    x = (np.random.default_rng(0).standard_t(2, size=(4, 6)) * 3).astype(src)
    x[0, :3] = [np.nan, np.inf, 1e4]                     # NaN, and overflow -> NaN
    d = F8[fmt]
    codes, back16, back32 = run_ops(
        lambda t, k: (lambda c: (c, ops.pow2scale_cast_from_fp8(c, ops.negate(k), popxl.float16),
                                 ops.pow2scale_cast_from_fp8(c, ops.negate(k), popxl.float32)))(
            ops.pow2scale_cast_to_fp8(t, k, d)), x, scale(s))
    want = enc(x, d, s)
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(back32, values(want, -s))
    np.testing.assert_array_equal(back16, values(want, -s).astype(np.float16))
    assert codes.dtype == NP8[d] and back16.dtype == np.float16


MATMULS = [((3, 4), (4, 5), "143", "143"), ((2, 3, 4), (4, 2), "143", "152"),
           ((4,), (2, 4, 3), "152", "152"), ((5, 6), (6,), "152", "143")]


@pytest.mark.parametrize("a_shape,b_shape,fa,fb", MATMULS)
@pytest.mark.parametrize("s", [-3, 0, 2])
def test_matmul_pow2scaled_matches_numpy(a_shape, b_shape, fa, fb, s):
    rng = np.random.default_rng(1)
    a = fp8_array(rng.normal(size=a_shape), F8[fa], 2)
    b = fp8_array(rng.normal(size=b_shape), F8[fb], 1)
    y, = run_ops(lambda p, q, k: ops.matmul_pow2scaled(p, q, k), a, b, scale(s))
    want = (np.matmul(values(a).astype(np.float64), values(b).astype(np.float64)) * 2.0 ** s)
    assert y.dtype == np.float16 and y.shape == want.shape
    np.testing.assert_allclose(y, want.astype(np.float16), rtol=1e-3, atol=1e-6)


def test_matmul_pow2scaled_python_int_scale_and_op_type():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 2)), popxl.float8_143, "a")
        y = ops.matmul_pow2scaled(a, a, -1)
        op = ir.main_graph._data.ops[-1]
    assert op.type == "MatMul" and len(op.inputs) == 3 and y.dtype == popxl.float16


@pytest.mark.parametrize("transpose", [False, True])
def test_conv_pow2scaled_and_transpose_match_reference(transpose):
    rng = np.random.default_rng(2)
    x = fp8_array(rng.normal(size=(2, 4, 5, 5)), popxl.float8_143, 1)
    w = fp8_array(rng.normal(size=(4, 2, 3, 3)), popxl.float8_152)
    kw = dict(stride=(2, 1), padding=(1, 0, 1, 0), groups=2)
    if transpose:
        y, = run_ops(lambda a, b, k: ops.conv_transpose_pow2scaled(
            a, b, k, output_padding=(1, 0), **kw), x, w, scale(-2))
        want = ref.conv_transpose(values(x).astype(np.float64), values(w).astype(np.float64),
                                  stride=(2, 1), pads=(1, 0, 1, 0), groups=2,
                                  output_padding=(1, 0))
    else:
        y, = run_ops(lambda a, b, k: ops.conv_pow2scaled(a, b, k, **kw), x, w, scale(-2))
        want = ref.conv(values(x).astype(np.float64), values(w).astype(np.float64), stride=(2, 1),
                        pads=(1, 0, 1, 0), groups=2)
    assert y.dtype == np.float16 and y.shape == want.shape
    np.testing.assert_allclose(y, (want / 4).astype(np.float16), rtol=1e-3, atol=1e-6)


# --- gradients ------------------------------------------------------------------------------
def fp8_grads(fn, arrays, dy):
    """(output, input gradients) of `fn` through popxl.transforms.autodiff; gradients of
    float8 inputs come back as float8 host data."""
    ir = popxl.Ir()
    with ir.main_graph:
        specs = [popxl.TensorSpec(a.shape, popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        g = ir.create_graph(fn, *specs)
        req = [t for t in g.inputs if t.dtype.is_floating_point]
        bwd = popxl.transforms.autodiff(g, grads_required=req)
        streams = [popxl.h2d_stream(a.shape, popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        info = ops.call_with_info(g, *[ops.host_load(s) for s in streams])
        dys = popxl.h2d_stream(dy.shape, popxl.dtype.as_dtype(dy.dtype))
        outs = [info.outputs[0]] + list(ops.call(bwd.graph, ops.host_load(dys),
                                                 inputs_dict=bwd.inputs_dict(info)))
        d2h = []
        for o in outs:
            d2h.append(popxl.d2h_stream(o.shape, o.dtype))
            ops.host_store(d2h[-1], o)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({**dict(zip(streams, arrays)), dys: dy})
    return [res[s] for s in d2h]


def assert_codes_close(got, exact, dtype):
    """`got` codes equal the cast of `exact` (float64) up to one code where float32
    accumulation can fall on the other side of a rounding boundary."""
    want = enc(exact, dtype)
    assert got.dtype == want.dtype
    close = np.abs(values(got).astype(np.float64) - values(want)) <= \
        np.abs(values(want)) * 2.0 ** -2 + 1e-30
    assert close.all() and (got == want).mean() > 0.9, (got, want)


def test_cast_grads_are_straight_through():
    x = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)
    dy = fp8_array(np.random.default_rng(4).normal(size=(3, 4)), popxl.float8_152)
    y, dx = fp8_grads(lambda t: ops.pow2scale_cast_to_fp8(t, 3, popxl.float8_152), [x], dy)
    np.testing.assert_array_equal(y, enc(x, popxl.float8_152, 3))
    np.testing.assert_array_equal(dx, values(dy, 3))
    codes = fp8_array(x, popxl.float8_143)
    dy32 = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    y, dx = fp8_grads(lambda t: ops.pow2scale_cast_from_fp8(t, -2, popxl.float32), [codes], dy32)
    np.testing.assert_array_equal(y, values(codes, -2))
    np.testing.assert_array_equal(dx, enc(dy32, popxl.float8_143, -2))


@pytest.mark.parametrize("a_shape,b_shape,fa,fb", MATMULS[:3])
def test_matmul_pow2scaled_grads(a_shape, b_shape, fa, fb):
    rng = np.random.default_rng(6)
    a = fp8_array(rng.normal(size=a_shape), F8[fa])
    b = fp8_array(rng.normal(size=b_shape), F8[fb])
    out_shape = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    dy = rng.normal(size=out_shape).astype(np.float16)
    y, da, db = fp8_grads(lambda p, q: ops.matmul_pow2scaled(p, q, 2), [a, b], dy)
    A, B, D = (v.astype(np.float64) for v in (values(a), values(b), dy))
    A2 = A.reshape(1, -1) if A.ndim == 1 else A
    D2 = D.reshape(D.shape[:-1] + (1,) + D.shape[-1:]) if A.ndim == 1 else D
    want_da = (D2 @ np.swapaxes(B, -1, -2) * 4).reshape((-1,) + a_shape).sum(axis=0)
    want_db = (np.swapaxes(A2, -1, -2) @ D2 * 4)
    want_db = want_db.reshape((-1,) + b_shape).sum(axis=0)
    assert da.dtype == NP8[F8[fa]] and db.dtype == NP8[F8[fb]]
    assert_codes_close(da, want_da, F8[fa])
    assert_codes_close(db, want_db, F8[fb])


def test_conv_pow2scaled_grads_match_reference():
    rng = np.random.default_rng(7)
    x = fp8_array(rng.normal(size=(2, 2, 4, 4)), popxl.float8_143)
    w = fp8_array(rng.normal(size=(3, 2, 2, 2)), popxl.float8_143)
    dy = rng.normal(size=(2, 3, 2, 3)).astype(np.float16)
    y, dx, dw = fp8_grads(lambda a, b: ops.conv_pow2scaled(a, b, 1, stride=(2, 1)), [x, w], dy)
    X, W, D = values(x).astype(np.float64), values(w).astype(np.float64), dy.astype(np.float64)
    out = ref.conv(X, W, stride=(2, 1)) * 2
    want_dx = ref.linear_vjp(lambda a: ref.conv(a, W, stride=(2, 1)) * 2, X.shape, D)
    want_dw = ref.linear_vjp(lambda b: ref.conv(X, b, stride=(2, 1)) * 2, W.shape, D)
    np.testing.assert_allclose(y, out.astype(np.float16), rtol=1e-3)
    assert_codes_close(dx, want_dx, popxl.float8_143)
    assert_codes_close(dw, want_dw, popxl.float8_143)


# --- errors ---------------------------------------------------------------------------------
def test_runtime_log2_scale_out_of_range_names_the_op():
    a = fp8_array(np.ones((2, 2)), popxl.float8_143)
    with pytest.raises(Exception, match=r"MatMul.*log2_scale must lie in \[-32, 32\), got 40"):
        run_ops(lambda p, k: ops.matmul_pow2scaled(p, p, k), a, scale(40))


@pytest.mark.parametrize("op", ["matmul", "cast_to", "cast_from", "conv"])
@pytest.mark.parametrize("k", [-50, 100])
def test_throw_if_log2_scale_tensor_not_in_range_option(op, k):
    """SessionOptions.throwIfLog2ScaleTensorNotInRange (upstream's default: on): a run-time
    log2 scale outside [-32, 32) is a Poplar application runtime error, caught as upstream's
    `popart.poplar_application_runtime_error`; with the option off the op runs (undefined
    upstream), scaling by 2^k like in range: the cast to float8 of 1.0 by 2^-50 is 0."""
    import popart

    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange = True
    ones8 = fp8_array(np.ones((1, 1, 2, 2)), popxl.float8_143)
    with ir.main_graph:
        kv = popxl.variable(np.int32(k), popxl.int32, name="k")
        x8 = popxl.variable(ones8, popxl.float8_143, name="x8")
        f = popxl.variable(np.ones((1, 1, 2, 2), np.float32), name="f")
        y = {"matmul": lambda: ops.matmul_pow2scaled(x8, x8, kv),
             "cast_to": lambda: ops.pow2scale_cast_from_fp8(
                 ops.pow2scale_cast_to_fp8(f, kv, popxl.float8_143), 0, popxl.float32),
             "cast_from": lambda: ops.pow2scale_cast_from_fp8(x8, kv, popxl.float32),
             "conv": lambda: ops.conv_pow2scaled(x8, x8, kv)}[op]()
        out = popxl.d2h_stream(y.shape, y.dtype, "out")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as sess:
        with pytest.raises(popart.poplar_application_runtime_error,
                           match=rf"log2_scale must lie in \[-32, 32\), got {k} "
                                 rf"\(SessionOptions.throwIfLog2ScaleTensorNotInRange\)"):
            sess.run()
    ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange = False
    with popxl.Session(ir, "ipu_model") as sess:
        got = sess.run()[out]
    base = {"matmul": 2.0, "cast_to": 1.0, "cast_from": 1.0, "conv": 4.0}[op]
    with np.errstate(over="ignore"):     # rounded once to the output dtype (matmul, conv: f16)
        want = (np.float32(base) * np.float32(2.0 ** k)).astype(got.dtype)
    if op == "cast_to":                  # through float8: 2^100 -> NaN, 2^-50 -> 0
        want = np.float32(np.nan if k > 0 else 0.0)
    np.testing.assert_array_equal(got.reshape(-1)[0], want)


@pytest.mark.parametrize("build,err,match", [
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(i, 0, popxl.float8_143), TypeError,
     "float16 or float32"),
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(f, 0, popxl.float16), TypeError,
     "^Data type popxl.dtypes.float16 not supported for popxl.ops.cast"),
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(f, f, popxl.float8_143), ValueError,
     "^Log2 scale argument must be a scalar tensor"),
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(f, ops.reshape(f, (4,))[0], popxl.float8_143),
     TypeError, "^Log2 scale tensor must be of type popxl.int32"),
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(f, ops.reshape(i, (4,))[:1], popxl.float8_143),
     ValueError, "^Log2 scale argument must be a scalar tensor"),
    (lambda f, x8, i: ops.pow2scale_cast_to_fp8(f, 32, popxl.float8_143), ValueError,
     r"\[-32, 32\)"),
    (lambda f, x8, i: ops.pow2scale_cast_from_fp8(f, 0, popxl.float32), TypeError,
     "must be float8_143 or float8_152"),
    (lambda f, x8, i: ops.pow2scale_cast_from_fp8(x8, 0, popxl.int32), TypeError,
     "^Data type popxl.dtypes.int32 not supported for popxl.ops.cast"),
    (lambda f, x8, i: ops.matmul_pow2scaled(f, f, 0), TypeError,
     "^Scaled matmul operands must be of dtype popxl.float8_143 or popxl.float8_152"),
    (lambda f, x8, i: ops.matmul_pow2scaled(x8, x8, f), ValueError,
     "^Log2 scale argument must be a scalar tensor"),
    (lambda f, x8, i: ops.matmul_pow2scaled(x8, ops.reshape(x8, (4, 1)), 0), ValueError,
     "inner dims"),
    (lambda f, x8, i: ops.conv_pow2scaled(ops.reshape(f, (1, 1, 2, 2)),
                                          ops.reshape(x8, (1, 1, 2, 2)), 0), TypeError,
     "^Scaled conv operands must be of dtype popxl.float8_143 or popxl.float8_152"),
    (lambda f, x8, i: ops.conv_transpose_pow2scaled(
        ops.reshape(x8, (1, 1, 2, 2)), ops.reshape(x8, (1, 1, 2, 2)),
        ops.cast(ops.reshape(i, (4,))[0], popxl.float32)), TypeError,
     "^Log2 scale tensor must be of type popxl.int32"),
    (lambda f, x8, i: ops.conv(x8, x8), TypeError, "conv_pow2scaled"),
    (lambda f, x8, i: ops.gelu(x8), TypeError, "float8 inputs are not supported"),
])
def test_float8_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        f = popxl.variable(np.ones((2, 2)), popxl.float32, "f")
        x8 = popxl.variable(np.ones((2, 2)), popxl.float8_143, "x8")
        i = popxl.variable(np.ones((2, 2), np.int32), popxl.int32, "i")
        with pytest.raises(err, match=match):
            build(f, x8, i)
