"""The fused (block-by-block) kernels give the bits of their unfused definitions, written here in
NumPy, with and without preallocated outputs, for float32 and float16 (float16: the definition in
float32 on the float16 values, rounded once)."""

import numpy as np
import pytest

import popxl
from popxl._ir.records import TensorInfo, TensorKind
from popxl.engine.kernels import load_all
from popxl.engine.kernels.registry import KERNELS

load_all()
rng = np.random.default_rng(7)
K = np.float32(np.sqrt(2.0 / np.pi))
C = np.float32(0.044715)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def info(a_or_shape, dtype=None) -> TensorInfo:
    if isinstance(a_or_shape, np.ndarray):
        shape, dtype = a_or_shape.shape, a_or_shape.dtype
    else:
        shape = a_or_shape
    return TensorInfo("t", shape, popxl.dtypes.dtype.as_dtype(np.dtype(dtype)),
                      TensorKind.INTERMEDIATE)


def kernel(op_type, attrs, ins, outs):
    spec = KERNELS[op_type]
    return spec.factory(attrs, [info(a) for a in ins], [info(*o) for o in outs])


def assert_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"max diff {np.max(np.abs(got - want))}"


def in_f32(fn, *arrays, out_dtype):
    """The definition on float32 values, rounded to the output dtype once."""
    res = fn(*[a.astype(F32) for a in arrays])
    if isinstance(res, tuple):
        return tuple(r.astype(out_dtype) for r in res)
    return res.astype(out_dtype)


# --- definitions (the unfused op sequences) ------------------------------------------------------
def gelu_ref(x):
    t = x * x
    t *= C * x
    t += x
    t *= K
    np.tanh(t, out=t)
    t += 1
    t *= x
    t *= 0.5
    return t


def gelu_grad_ref(dy, x):
    x2 = x * x
    inner = (x2 * C + 1) * x * K
    th = np.tanh(inner)
    dinner = (x2 * (3 * C) + 1) * K
    sech2 = 1 - th * th
    g = 0.5 * (1 + th) + 0.5 * x * sech2 * dinner
    g *= dy
    return g


def softmax_ref(x, axis=-1):
    e = x - np.max(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def softmax_grad_ref(dy, y, axis=-1):
    g = dy * y
    g -= y * np.sum(g, axis=axis, keepdims=True)
    return g


def layer_norm_ref(x, w, b, eps):
    n, c = x.shape
    xg = x.reshape(n, 1, c).astype(F32)
    mean = xg.mean(axis=2, keepdims=True)
    xc = xg - mean
    var = np.mean(xc * xc, axis=2, keepdims=True)
    inv = 1 / np.sqrt(var + np.float32(eps))
    y = (xc * inv).reshape(n, c)
    y *= w.reshape(1, c)
    y += b.reshape(1, c)
    return y, mean.reshape(-1), inv.reshape(-1)


def layer_norm_grad_ref(dy, x, w, mean, inv):
    n, c = x.shape
    inv_g = inv.reshape(n, 1, 1)
    xhat = ((x.reshape(n, 1, c) - mean.reshape(n, 1, 1)) * inv_g).reshape(n, c)
    dw = np.sum(dy * xhat, axis=(0,))
    db = np.sum(dy, axis=(0,))
    dxhat = (dy * w.reshape(1, c)).reshape(n, 1, c)
    xh = xhat.reshape(n, 1, c)
    dx = dxhat - dxhat.mean(axis=2, keepdims=True)
    dx -= xh * np.mean(dxhat * xh, axis=2, keepdims=True)
    dx *= inv_g
    return dx.reshape(n, c), dw, db


SHAPES = [(3, 5), (7,), (64, 128), (2, 3, 17, 33), (1, 40000), (300, 256)]


def run_both(fn, arrays, out_shapes, out_dtypes):
    """fn without `out`, and with preallocated outputs (returned arrays must be those)."""
    plain = fn(*arrays)
    outs = tuple(np.full(s, np.nan, d) for s, d in zip(out_shapes, out_dtypes))
    got = fn(*arrays, out=outs if len(outs) > 1 else outs[0])
    if len(outs) == 1:
        assert got is outs[0]
        return (plain,), outs
    for g, o in zip(got, outs):
        assert g is o
    return plain, outs


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_and_grad_bits(shape, dtype):
    x = (rng.normal(size=shape) * 3).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    plain, outs = run_both(kernel("Gelu", {}, [x], [(shape, dtype)]), [x], [shape], [dtype])
    want = in_f32(gelu_ref, x, out_dtype=dtype)
    assert_bits(plain[0], want)
    assert_bits(outs[0], want)
    fn = kernel("GeluGrad", {}, [dy, x], [(shape, dtype)])
    plain, outs = run_both(fn, [dy, x], [shape], [dtype])
    want = in_f32(gelu_grad_ref, dy, x, out_dtype=dtype)
    assert_bits(plain[0], want)
    assert_bits(outs[0], want)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gelu_in_place_output(dtype):
    """The memory plan may give the output the input's own buffer."""
    x = (rng.normal(size=(100, 300)) * 3).astype(dtype)
    want = in_f32(gelu_ref, x, out_dtype=dtype)
    buf = x.copy()
    assert kernel("Gelu", {}, [x], [(x.shape, dtype)])(buf, out=buf) is buf
    assert_bits(buf, want)
    dy = rng.normal(size=x.shape).astype(dtype)
    want = in_f32(gelu_grad_ref, dy, x, out_dtype=dtype)
    for i in (0, 1):
        ins = [dy.copy(), x.copy()]
        assert kernel("GeluGrad", {}, [dy, x], [(x.shape, dtype)])(*ins, out=ins[i]) is ins[i]
        assert_bits(ins[i], want)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_and_grad_bits(shape, dtype):
    x = (rng.normal(size=shape) * 4).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    for axis in sorted({-1, 0}):
        y_want = in_f32(lambda a: softmax_ref(a, axis), x, out_dtype=dtype)
        plain, outs = run_both(kernel("Softmax", {"axis": axis}, [x], [(shape, dtype)]), [x],
                               [shape], [dtype])
        assert_bits(plain[0], y_want)
        assert_bits(outs[0], y_want)
        g_want = in_f32(lambda a, b: softmax_grad_ref(a, b, axis), dy, y_want, out_dtype=dtype)
        fn = kernel("SoftmaxGrad", {"axis": axis}, [dy, y_want], [(shape, dtype)])
        plain, outs = run_both(fn, [dy, y_want], [shape], [dtype])
        assert_bits(plain[0], g_want)
        assert_bits(outs[0], g_want)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gelu_special_values(dtype, loops):
    """Infinities, NaNs, the largest and smallest values (float16: read and rounded by the
    compiled loops as they load and store)."""
    big, tiny = np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal
    x = np.array([np.inf, -np.inf, np.nan, big, -big, tiny, -tiny, 0.0, -0.0, 3.0] * 7, dtype)
    dy = np.array([1.0, -2.0, 0.5, np.nan, 1.0, np.inf, 1.0, -0.0, 2.0, 1.0] * 7, dtype)
    for got, want in ((kernel("Gelu", {}, [x], [(x.shape, dtype)])(x),
                       in_f32(gelu_ref, x, out_dtype=dtype)),
                      (kernel("GeluGrad", {}, [dy, x], [(x.shape, dtype)])(dy, x),
                       in_f32(gelu_grad_ref, dy, x, out_dtype=dtype))):
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all()
        assert_bits(got[~nan], want[~nan])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_softmax_in_place_output(dtype):
    """The memory plan may give Softmax's output x's buffer, SoftmaxGrad's dy's."""
    x = (rng.normal(size=(70, 300)) * 4).astype(dtype)
    y = in_f32(softmax_ref, x, out_dtype=dtype)
    buf = x.copy()
    assert kernel("Softmax", {"axis": -1}, [x], [(x.shape, dtype)])(buf, out=buf) is buf
    assert_bits(buf, y)
    dy = rng.normal(size=x.shape).astype(dtype)
    want = in_f32(softmax_grad_ref, dy, y, out_dtype=dtype)
    buf = dy.copy()
    fn = kernel("SoftmaxGrad", {"axis": -1}, [dy, y], [(x.shape, dtype)])
    assert fn(buf, y, out=buf) is buf
    assert_bits(buf, want)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("c", [1, 15, 16, 17, 40, 4101])
def test_softmax_special_values(c, dtype, loops):
    """The row max taken in lanes (`_jit_ew.softmax_shift_rows`; float16 read as it loads): the
    maximum in any lane or the tail, signed zeros, infinities, and NaNs (anywhere: the row is
    NaN)."""
    x = (rng.normal(size=(12, c)) * 4).astype(dtype)
    for r, col in enumerate([0, 1 % c, c // 2, c - 1, max(c - 3, 0), 16 % c]):
        x[r, col] = 30.0                          # the row's max, in a different place each
    x[6] = 0.0
    x[6, ::2] = -0.0
    x[7, c // 2] = np.inf
    x[8, -1] = -np.inf
    x[9, c - 1] = np.nan
    x[10, 0] = np.nan
    x[11, c // 3] = np.nan
    want = in_f32(softmax_ref, x, out_dtype=dtype)
    got = kernel("Softmax", {"axis": -1}, [x], [(x.shape, dtype)])(x)
    nan_rows = np.isnan(want).any(axis=1)
    assert (np.isnan(got[nan_rows]).all(axis=1) == np.isnan(want[nan_rows]).all(axis=1)).all()
    assert_bits(got[~nan_rows], want[~nan_rows])


def test_softmax_non_contiguous_input():
    x = rng.normal(size=(6, 8, 10)).astype(F32).transpose(0, 2, 1)
    fn = kernel("Softmax", {"axis": -1}, [np.ascontiguousarray(x)], [(x.shape, F32)])
    assert_bits(fn(x), softmax_ref(x))          # the layout decides the reduction order


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape", [(3, 5), (64, 256), (513, 96), (4, 5000)])
def test_layer_norm_and_grad_bits(shape, dtype):
    n, c = shape
    x = (rng.normal(size=shape) * 2 + 0.5).astype(dtype)
    w = rng.normal(size=c).astype(dtype)
    b = rng.normal(size=c).astype(dtype)
    attrs = {"num_groups": 1, "epsilon": 1e-5}
    fn = kernel("GroupNormalization", attrs, [x, w, b], [(shape, dtype), ((n,), dtype),
                                                        ((n,), dtype)])
    want = in_f32(lambda *a: layer_norm_ref(*a, 1e-5), x, w, b, out_dtype=dtype)
    plain, outs = run_both(fn, [x, w, b], [shape, (n,), (n,)], [dtype] * 3)
    for p, o, ww in zip(plain, outs, want):
        assert_bits(p, ww)
        assert_bits(o, ww)
    y, mean, inv = want
    dy = rng.normal(size=shape).astype(dtype)
    fn = kernel("GroupNormalizationGrad", attrs, [dy, x, w, mean, inv],
                [(shape, dtype), ((c,), dtype), ((c,), dtype)])
    want = in_f32(layer_norm_grad_ref, dy, x, w, mean, inv, out_dtype=dtype)
    plain, outs = run_both(fn, [dy, x, w, mean, inv], [shape, (c,), (c,)], [dtype] * 3)
    for p, o, ww in zip(plain, outs, want):
        assert_bits(p, ww)
        assert_bits(o, ww)


def test_layer_norm_matches_float64_reference():
    """An independent check of the arithmetic itself (not only of the fusion)."""
    x = rng.normal(size=(50, 70))
    w, b = rng.normal(size=70), rng.normal(size=70)
    fn = kernel("GroupNormalization", {"num_groups": 1, "epsilon": 1e-5},
                [x.astype(F32), w.astype(F32), b.astype(F32)],
                [((50, 70), F32), ((50,), F32), ((50,), F32)])
    y, mean, inv = fn(x.astype(F32), w.astype(F32), b.astype(F32))
    m = x.mean(1, keepdims=True)
    ref = (x - m) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, m[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_nll_softmax_grad_bits(dtype):
    n, c = 96, 1000
    logits = rng.normal(size=(n, c)).astype(F32) * 3
    probs = softmax_ref(logits).astype(dtype)
    labels = rng.integers(0, c, n).astype(np.int32)
    labels[5] = -100
    g = np.array(1.0, np.float32)
    for ignore in (None, -100):
        lab = labels if ignore is not None else np.abs(labels) % c
        fn = kernel("NlllWithSoftmaxGradDirect", {"ignore_index": ignore, "reduction": "mean"},
                    [probs, lab, g], [((), F32), ((n, c), dtype)])
        p = probs.astype(F32)
        rows = np.arange(n)
        valid = np.ones(n, bool) if ignore is None else lab != ignore
        safe = np.where(valid, lab, 0)
        loss = np.where(valid, -np.log(p[rows, safe] + np.float32(1e-7)), 0).astype(F32)
        dx = p.copy()
        dx[rows, safe] -= 1
        dx[~valid] = 0
        count = max(int(valid.sum()), 1)
        dx *= np.float32(1.0) / np.float32(count)
        want_loss = np.asarray(np.float32(loss.sum(dtype=F32) / count), F32)
        plain, outs = run_both(fn, [probs, lab, g], [(), (n, c)], [F32, dtype])
        for got in (plain, outs):
            assert_bits(got[0], want_loss)
            assert_bits(got[1], dx.astype(dtype))


# --- float16: computed in float32 on the float16 values, rounded once (NumPy's casts) -----------
def f16(a):
    with np.errstate(all="ignore"):
        return np.asarray(a).astype(F16)


def f32(a):
    return np.asarray(a).astype(F32)


@pytest.mark.parametrize("op,ufunc", [("Add", np.add), ("Sub", np.subtract),
                                      ("Mul", np.multiply), ("Div", np.divide)])
@pytest.mark.parametrize("sa,sb", [((4, 5), (4, 5)), ((300, 700), (700,)), ((700,), (300, 700)),
                                   ((8, 4, 64, 64), (64, 64)), ((3, 1), (3, 4)), ((2, 3), ()),
                                   ((), (300, 70)), ((64, 64), (8, 4, 64, 64))])
def test_binary_f16_bits(op, ufunc, sa, sb):
    a = f16(rng.normal(size=sa) * 2)
    b = f16(rng.normal(size=sb) + 3)
    shape = np.broadcast_shapes(sa, sb)
    fn = kernel(op, {}, [a, b], [(shape, F16)])
    want = f16(ufunc(f32(a), f32(b)))
    assert_bits(fn(a, b), want)
    if not getattr(fn, "no_out", False):
        out = np.empty(shape, F16)
        assert fn(a, b, out=out) is out
        assert_bits(out, want)
        if sa == shape:                       # the memory plan may hand over a's buffer
            buf = a.copy()
            assert_bits(fn(buf, b, out=buf), want)
        if sb == shape:                       # or b's
            buf = b.copy()
            assert_bits(fn(a, buf, out=buf), want)


@pytest.mark.parametrize("sa,sb", [((64, 96), (96, 32)), ((8, 4, 33, 16), (8, 4, 16, 33)),
                                   ((100,), (100, 7))])
@pytest.mark.parametrize("out_dtype", [F16, F32])
def test_matmul_f16_bits(sa, sb, out_dtype):
    a, b = f16(rng.normal(size=sa)), f16(rng.normal(size=sb))
    shape = np.matmul(f32(a), f32(b)).shape
    fn = kernel("MatMul", {}, [a, b], [(shape, out_dtype)])
    want = np.matmul(f32(a), f32(b)).astype(out_dtype)
    assert_bits(fn(a, b), want)
    assert_bits(fn(a.T.copy().T, b), want)            # a non-contiguous operand
    out = np.empty(shape, out_dtype)
    assert fn(a, b, out=out) is out
    assert_bits(out, want)


@pytest.mark.parametrize("a_base,perm_a,b_base,perm_b", [
    ((8, 5, 3, 16), (0, 2, 1, 3), (8, 7, 3, 16), (0, 2, 3, 1)),    # q @ k.T, heads split off
    ((8, 3, 5, 7), (0, 1, 2, 3), (8, 7, 3, 16), (0, 2, 1, 3)),     # probs @ v
    ((5, 8, 3, 16), (1, 2, 0, 3), (16, 3, 8, 7), (2, 1, 0, 3)),    # batch axes moved too
])
def test_matmul_f16_permuted_operands(a_base, perm_a, b_base, perm_b):
    """float16 operands that are permuted views of contiguous arrays (converted in their memory
    order) give the bits of contiguous ones."""
    a = f16(rng.normal(size=a_base)).transpose(perm_a)
    b = f16(rng.normal(size=b_base)).transpose(perm_b)
    want = np.matmul(np.ascontiguousarray(f32(a)), np.ascontiguousarray(f32(b))).astype(F16)
    fn = kernel("MatMul", {}, [np.ascontiguousarray(a), np.ascontiguousarray(b)],
                [(want.shape, F16)])
    assert_bits(fn(a, b), want)


def test_matmul_f32_out_bits():
    a, b = rng.normal(size=(70, 50)).astype(F32), rng.normal(size=(50, 90)).astype(F32)
    fn = kernel("MatMul", {}, [a, b], [((70, 90), F32)])
    out = np.empty((70, 90), F32)
    assert fn(a, b, out=out) is out
    assert_bits(out, a @ b)


@pytest.mark.parametrize("n_in", [1, 2, 3])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_grad_sum_bits(n_in, dtype, loops):
    xs = [(rng.normal(size=(300, 500)) * 10.0 ** rng.integers(-6, 2)).astype(dtype)
          for _ in range(n_in)]
    fn = kernel("Sum", {}, xs, [((300, 500), dtype)])
    acc = xs[0].copy()
    for x in xs[1:]:                           # each addition rounded to the dtype
        acc = (f32(acc) + f32(x)).astype(dtype)
    got = fn(*xs)
    assert_bits(got, acc)
    assert not any(np.shares_memory(got, x) for x in xs)
    out = np.empty((300, 500), dtype)
    assert_bits(fn(*xs, out=out), acc)
    for i in range(min(n_in, 2)):                 # the output may be input 0's or 1's buffer
        bufs = [x.copy() for x in xs]
        assert_bits(fn(*bufs, out=bufs[i]), acc)


def test_grad_sum_float16_of_mixed_inputs(loops):
    """float16 gradients summed with float32 ones: each addition in float32, rounded."""
    xs = [rng.normal(size=(40, 70)).astype(d) for d in (F16, F32, F16)]
    fn = kernel("Sum", {}, xs, [((40, 70), F16)])
    want = ((f32(xs[0]) + xs[1]).astype(F16).astype(F32) + f32(xs[2])).astype(F16)
    assert_bits(fn(*xs), want)


@pytest.mark.parametrize("t_dtype,x_dtype", [(F32, F32), (F16, F16), (F16, F32), (F32, F16)])
@pytest.mark.parametrize("mode", ["moving_average", "moving_average_square"])
def test_accumulate_bits(t_dtype, x_dtype, mode):
    t0 = (rng.normal(size=(200, 700)) * 1e-3).astype(t_dtype)
    x = (rng.normal(size=(200, 700)) * 1e-4).astype(x_dtype)
    f = np.float32(0.9)
    xv = f32(x.astype(t_dtype))                 # X rounded into t's dtype first
    if mode.endswith("square"):
        xv = xv * xv
    want = (f32(t0) * f + xv * (np.float32(1) - f)).astype(t_dtype)
    t = t0.copy()
    fn = kernel("Accumulate", {"mode": mode, "f": 0.9}, [t, x], [(t.shape, t_dtype)])
    assert fn(t, x) is t
    assert_bits(t, want)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_adam_updater_bits(dtype):
    n = 300_000
    w = rng.normal(size=n).astype(dtype)
    m = (rng.normal(size=n) * 1e-3).astype(dtype)
    v = (np.abs(rng.normal(size=n)) * 1e-6).astype(F32)
    step = np.array(3.0, np.float32)
    attrs = {"mode": "adam", "has_weight": True, "has_step": True, "beta1": 0.9,
             "beta2": 0.999, "epsilon": 1e-5, "bias_correction": True, "wd": 0.01}
    fn = kernel("AdamUpdater", attrs, [w, m, v, step], [((n,), dtype)])
    ts = np.float32(4.0)
    mm = f32(m) / (np.float32(1) - np.power(np.float32(0.9), ts))
    vv = f32(v) / (np.float32(1) - np.power(np.float32(0.999), ts))
    want = (mm / (np.sqrt(vv) + np.float32(1e-5)) + np.float32(0.01) * f32(w)).astype(dtype)
    out = np.empty(n, dtype)
    assert fn(w, m, v, step, out=out) is out
    assert float(step) == 4.0
    assert_bits(out, want)


def test_to_f16_bits_edge_cases():
    """The float32 -> float16 converter against NumPy's cast: ties, every exponent, the
    subnormal range, overflow, infinities and NaNs (the converter's own exhaustive check over
    all 2**32 patterns was run when it was written)."""
    from popxl.engine.kernels._util import to_f16

    u = np.concatenate([
        rng.integers(0, 2 ** 32, 400_000, dtype=np.uint64).astype(np.uint32),
        (np.arange(256, dtype=np.uint32) << 23) | 0x1000,         # ties, every exponent
        (np.arange(256, dtype=np.uint32) << 23) | 0x3000,
        (np.arange(256, dtype=np.uint32) << 23) | 0x0FFF,
        np.array([0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x7F800000, 0x7FC00001,
                  0x7F800001, 0x33000000, 0x33000001, 0x387FF000], np.uint32)])
    u = np.concatenate([u, u | 0x80000000])
    x = u.view(np.float32)
    assert_bits(to_f16(x).view(np.uint16), f16(x).view(np.uint16))


@pytest.mark.parametrize("c", [1, 7, 8, 9, 64, 100, 128, 129, 136, 255, 256, 300, 768, 1000])
def test_row_kernels_bits_every_row_length(c):
    """The row kernels (compiled row by row when numba is installed: their row sums must be
    NumPy's pairwise sums) give the definitions' bits for row lengths around the pairwise
    summation's thresholds, and with zeros of both signs, infinities and NaN in some rows."""
    n = max(4, -(-5000 // c))
    x = (rng.normal(size=(n, c)) * 10.0 ** rng.uniform(-3, 3, (n, 1))).astype(F32)
    x[0] = -0.0
    x[1] = 0.0
    x[2, 0] = np.inf
    x[3, -1] = np.nan
    dy = rng.normal(size=(n, c)).astype(F32)
    with np.errstate(all="ignore"):
        y = kernel("Softmax", {"axis": -1}, [x], [((n, c), F32)])(x)
        want_y = softmax_ref(x)
        assert_bits(y, want_y)
        g = kernel("SoftmaxGrad", {"axis": -1}, [dy, want_y], [((n, c), F32)])(dy, want_y)
        assert_bits(g, softmax_grad_ref(dy, want_y))
        w, b = rng.normal(size=c).astype(F32), rng.normal(size=c).astype(F32)
        attrs = {"num_groups": 1, "epsilon": 1e-5}
        got = kernel("GroupNormalization", attrs, [x, w, b],
                     [((n, c), F32), ((n,), F32), ((n,), F32)])(x, w, b)
        want = layer_norm_ref(x, w, b, 1e-5)
        for a, e in zip(got, want):
            assert_bits(a, e)
        _, mean, inv = want
        got = kernel("GroupNormalizationGrad", attrs, [dy, x, w, mean, inv],
                     [((n, c), F32), ((c,), F32), ((c,), F32)])(dy, x, w, mean, inv)
        for a, e in zip(got, layer_norm_grad_ref(dy, x, w, mean, inv)):
            assert_bits(a, e)


SPECIAL_F16 = np.array([0x7C01, 0x7E00, 0xFD55, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x8001, 0x7BFF,
                        0xFBFF, 0x8000, 0x0000, 0x0400, 0x3C00], np.uint16).view(F16)


def with_specials(a):
    """`a` (float16) with NaNs (signalling, quiet, with payloads), infinities, subnormals,
    the largest finite values and zeros written over its first elements."""
    a = a.copy()
    a.reshape(-1)[:SPECIAL_F16.size] = SPECIAL_F16
    return a


@pytest.mark.parametrize("op,ufunc", [("Add", np.add), ("Sub", np.subtract),
                                      ("Mul", np.multiply)])
@pytest.mark.parametrize("b_dtype", [F16, F32])
def test_binary_f16_special_values(op, ufunc, b_dtype):
    """Overflow to infinity, subnormal results and NaN payloads as NumPy's casts give them."""
    a = with_specials(f16(rng.normal(size=(6, 40)) * 3e4))
    b = np.asarray(with_specials(f16(rng.normal(size=(6, 40)) * 3e4))[::-1].copy(), b_dtype)
    with np.errstate(all="ignore"):
        want = f16(ufunc(f32(a), f32(b)))
        got = kernel(op, {}, [a, b], [((6, 40), F16)])(a, b)
    assert_bits(got.view(np.uint16), want.view(np.uint16))
    row = np.asarray(b[0], b_dtype)                       # a broadcast row
    with np.errstate(all="ignore"):
        want = f16(ufunc(f32(a), f32(row)))
        got = kernel(op, {}, [a, row], [((6, 40), F16)])(a, row)
    assert_bits(got.view(np.uint16), want.view(np.uint16))


def test_add_lhs_inplace_f16_bits():
    a = with_specials(f16(rng.normal(size=(30, 70)) * 3e4))
    b = f16(rng.normal(size=(70,)) * 3e4)
    with np.errstate(all="ignore"):
        want = f16(f32(a) + f32(b))
        fn = kernel("AddLhsInplace", {}, [a, b], [((30, 70), F16)])
        assert fn(a, b) is a
    assert_bits(a.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("x_dtype", [F16, F32])
def test_scaled_add_inplace_f16_bits(x_dtype):
    x = with_specials(f16(rng.normal(size=(50, 30)) * 1e-3))
    y = np.asarray(rng.normal(size=(50, 30)) * 1e-4, x_dtype)
    a, b = np.float32(0.999), np.float32(-1e-3)
    with np.errstate(invalid="ignore"):
        want = f16(f32(x) * a + f32(y) * b)
    fn = kernel("ScaledAddLhsInplace", {"a": 0.999, "b": -1e-3}, [x, y], [((50, 30), F16)])
    assert fn(x, y) is x
    assert_bits(x.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("t_dtype,x_dtype", [(F16, F16), (F16, F32), (F32, F16)])
def test_accumulate_f16_special_values(t_dtype, x_dtype):
    t0 = np.asarray(with_specials(f16(rng.normal(size=(40, 50)) * 1e-3)), t_dtype)
    x = np.asarray(with_specials(f16(rng.normal(size=(40, 50)) * 1e-4))[::-1].copy(), x_dtype)
    if x_dtype == F32:            # signalling NaNs whose payload float16 cannot hold
        x.reshape(-1)[-2:] = np.array([0x7F800001, 0xFF800100], np.uint32).view(F32)
    f = np.float32(0.9)
    with np.errstate(all="ignore"):
        xv = f32(x.astype(t_dtype))
        want = (f32(t0) * f + xv * (np.float32(1) - f)).astype(t_dtype)
    t = t0.copy()
    fn = kernel("Accumulate", {"mode": "moving_average", "f": 0.9}, [t, x], [(t.shape, t_dtype)])
    with np.errstate(all="ignore"):
        fn(t, x)
    assert_bits(t.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("op,ins", [
    ("Gelu", [np.full((4, 8), 3e38, F32)]),
    ("ScaledAddLhsInplace", [np.full((4, 8), 3e38, F32), np.full((4, 8), 3e38, F32)]),
    ("Mul", [np.full((4, 8), 2, F16), np.full((8,), 3e38, F32)])])
def test_raising_fp_events_bypass_compiled_loops(op, ins):
    """With SessionOptions.enableFloatingPointChecks (events raise), kernels run NumPy's passes,
    which raise; the compiled loops (which cannot) stand aside."""
    from popxl.engine.kernels._util import fp_events

    attrs = {"a": 1.0, "b": 1.0} if op.startswith("Scaled") else {}
    shape = np.broadcast_shapes(*(a.shape for a in ins))
    fn = kernel(op, attrs, ins, [(shape, ins[0].dtype)])
    with fp_events(dict(all="ignore")):
        assert not np.isfinite(fn(*[a.copy() for a in ins])).all()
    with fp_events(dict(divide="raise", over="raise", invalid="raise", under="ignore")):
        with pytest.raises(FloatingPointError):
            fn(*[a.copy() for a in ins])
