"""Small tensors (GPT-3 tiny's few hundred elements) take the kernels' shortest route: one block and,
where numba is installed, the compiled loops at every size. Their bits must be those of the same rows
computed inside a large tensor and those of the NumPy passes (compiled loops disabled), NaN and inf
included, for float32 and float16."""
import numpy as np
import pytest

import popxl
from popxl._ir.records import TensorInfo, TensorKind
from popxl.engine.kernels import load_all
from popxl.engine.kernels.registry import KERNELS

load_all()
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
ROWS, C = 4, 48                     # the small tensor: 192 elements
BIG = 1000                          # rows of the large tensor holding it: 48,000 elements


def info(shape, dtype) -> TensorInfo:
    return TensorInfo("t", tuple(shape), popxl.dtypes.dtype.as_dtype(np.dtype(dtype)),
                      TensorKind.INTERMEDIATE)


def make(op_type, attrs, in_specs, out_specs):
    return KERNELS[op_type].factory(attrs, [info(*s) for s in in_specs],
                                    [info(*s) for s in out_specs])


def data(rows, dtype, seed, special=True, positive=False):
    """(rows, C) values whose first ROWS rows hold NaN, +-inf, signed zeros and subnormals."""
    r = np.random.default_rng(seed)
    a = r.normal(size=(rows, C)).astype(F32) * 3
    if positive:
        a = np.abs(a)
    if special:
        a[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-6]
        a[1, 3] = np.float32(2.0 ** -20)
    small = a[:ROWS].copy()
    a = np.tile(small, (rows // ROWS, 1)) if rows > ROWS else small
    return a.astype(dtype)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def run_small_and_big(op_type, attrs, arg_specs, n_outs=1, out_shapes=None, inplace=False):
    """The kernel on (ROWS, C) inputs and on (BIG, C) inputs repeating them: each output of the
    small run against the first rows of the big run's."""
    results = []
    for rows in (ROWS, BIG):
        args = [data(rows, dt, seed, **kw) if shape is None else data(rows, dt, seed, **kw)[0]
                for dt, seed, shape, kw in arg_specs]
        ins = [(a.shape, a.dtype) for a in args]
        shapes = out_shapes(rows) if out_shapes else [(rows, C)]
        outs = [(s, arg_specs[0][0]) for s in shapes[:n_outs]]
        fn = make(op_type, attrs, ins, outs)
        if inplace:
            res = fn(*args)
            results.append([np.array(res)])
        else:
            buf = [np.full(s, np.nan, d) for s, d in outs]
            res = fn(*args, out=tuple(buf) if n_outs > 1 else buf[0])
            results.append([np.array(r) for r in (res if n_outs > 1 else (res,))])
    return results


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("op", ["Gelu", "Softmax", "LayerNorm"])
def test_forward_kernels_small_equals_rows_of_large(op, dtype, loops):
    with np.errstate(all="ignore"):
        if op == "Gelu":
            small, big = run_small_and_big("Gelu", {}, [(dtype, 1, None, {})])
        elif op == "Softmax":
            small, big = run_small_and_big("Softmax", {"axis": -1}, [(dtype, 2, None, {})])
        else:
            small, big = run_small_and_big(
                "GroupNormalization", {"num_groups": 1, "epsilon": 1e-5},
                [(dtype, 3, None, {}), (dtype, 4, (C,), {}), (dtype, 5, (C,), {})], n_outs=3,
                out_shapes=lambda rows: [(rows, C), (rows,), (rows,)])
    for s, b in zip(small, big):
        assert bits(s) == bits(b[:s.shape[0]])


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("op", ["GeluGrad", "SoftmaxGrad"])
def test_grad_kernels_small_equals_rows_of_large(op, dtype, loops):
    attrs = {"axis": -1} if op == "SoftmaxGrad" else {}
    with np.errstate(all="ignore"):
        small, big = run_small_and_big(op, attrs, [(dtype, 6, None, {}), (dtype, 7, None, {})])
    assert bits(small[0]) == bits(big[0][:ROWS])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_layer_norm_grad_small_equals_rows_of_large(dtype, loops):
    """dx row by row; dweight and dbias sum columns, so the large input repeats the small one
    and the sums are compared against NumPy's sums written here."""
    with np.errstate(all="ignore"):
        for rows in (ROWS, BIG):
            dy, x = data(rows, dtype, 8, special=False), data(rows, dtype, 9)
            w = data(ROWS, dtype, 10)[0]
            mean = data(rows, dtype, 11, special=False)[:, 0]
            inv = data(rows, dtype, 12, special=False, positive=True)[:, 0]
            fn = make("GroupNormalizationGrad", {"num_groups": 1},
                      [(dy.shape, dtype), (x.shape, dtype), ((C,), dtype), ((rows,), dtype),
                       ((rows,), dtype)], [((rows, C), dtype), ((C,), dtype), ((C,), dtype)])
            dx, dw, db = fn(dy, x, w, mean, inv)
            if rows == ROWS:
                small_dx = np.array(dx)
            else:
                assert bits(small_dx) == bits(dx[:ROWS])
            assert bits(db) == bits(np.sum(dy.astype(F32), axis=(0,)).astype(dtype))


@pytest.mark.parametrize("t_dtype", [F32, F16])
@pytest.mark.parametrize("x_dtype", [F32, F16])
@pytest.mark.parametrize("mode", ["moving_average", "moving_average_square", "dampened_add"])
def test_accumulate_small_equals_rows_of_large(mode, t_dtype, x_dtype, loops):
    with np.errstate(all="ignore"):
        res = []
        for rows in (ROWS, BIG):
            t, x = data(rows, t_dtype, 13), data(rows, x_dtype, 14)
            fn = make("Accumulate", {"mode": mode, "f": 0.9},
                      [(t.shape, t_dtype), (x.shape, x_dtype)], [(t.shape, t_dtype)])
            t0 = t.copy()                          # Accumulate updates t in place
            res.append(np.array(fn(t, x)))
            t = t0
            # the NumPy definition: X rounded into t's dtype, the update in float32
            xv = x.astype(t_dtype).astype(F32)
            if mode == "moving_average_square":
                xv = xv * xv
            f = np.float32(0.9)
            want = (t.astype(F32) * f + xv * (np.float32(1) - f) if mode.startswith("moving")
                    else xv * f + t.astype(F32))
            assert bits(res[-1]) == bits(want.astype(t_dtype))
    assert bits(res[0]) == bits(res[1][:ROWS])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_adam_updater_small_equals_rows_of_large(dtype, loops):
    attrs = {"mode": "adam", "has_weight": True, "has_step": True, "epsilon": 1e-6,
             "beta1": 0.9, "beta2": 0.999, "bias_correction": True, "wd": 0.01}
    with np.errstate(all="ignore"):
        res = []
        for rows in (ROWS, BIG):
            w, m = data(rows, dtype, 15), data(rows, F32, 16)
            v = data(rows, F32, 17, positive=True)
            step = np.zeros((), F32)
            fn = make("AdamUpdater", attrs, [(w.shape, dtype), (m.shape, F32), (v.shape, F32),
                                             ((), F32)], [(w.shape, dtype)])
            res.append(np.array(fn(w, m, v, step, out=np.full(w.shape, np.nan, dtype))))
            dm, dv = np.float32(1) - np.float32(0.9), np.float32(1) - np.float32(0.999)
            want = (m / dm) / (np.sqrt(v / dv) + np.float32(1e-6)) + \
                w.astype(F32) * np.float32(0.01)
            assert bits(res[-1]) == bits(want.astype(dtype))
    assert bits(res[0]) == bits(res[1][:ROWS])


@pytest.mark.parametrize("op,ufunc", [("Add", np.add), ("Mul", np.multiply), ("Div", np.divide)])
def test_binary_f16_small_equals_numpy(op, ufunc, loops):
    with np.errstate(all="ignore"):
        a, b = data(ROWS, F16, 18), data(ROWS, F16, 19)[0]
        fn = make(op, {}, [(a.shape, F16), (b.shape, F16)], [(a.shape, F16)])
        got = fn(a, b, out=np.empty(a.shape, F16))
        assert bits(got) == bits(ufunc(a.astype(F32), b.astype(F32)).astype(F16))
