"""Kernels give the same bits on 1 thread and on several, with NumPy's passes and with the
compiled loops, float32 and float16: their blocks depend on the shapes only (element blocks,
whole rows), and on several threads the blocks really run in
parallel. (Each kernel's bits against its NumPy definition: test_fused_kernels.py.)"""
import numpy as np
import pytest

import popxl
from popxl._ir.records import TensorInfo, TensorKind
from popxl.engine import parallel
from popxl.engine.kernels import _blocks, _matmul_blocks, load_all
from popxl.engine.kernels.registry import KERNELS
from popxl.runtime.blas import blas_threads

load_all()
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
N, C = 700, 513                         # 359k elements: several blocks of every kind


def info(shape, dtype) -> TensorInfo:
    return TensorInfo("t", tuple(shape), popxl.dtypes.dtype.as_dtype(np.dtype(dtype)),
                      TensorKind.INTERMEDIATE)


def data(shape, dtype, seed, positive=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return (np.abs(x) + 0.1 if positive else x).astype(dtype)


def labels(seed):
    return np.random.default_rng(seed).integers(0, C, N).astype(np.int32)


def cases(dt):
    """(op type, attrs, inputs, output (shape, dtype)s, pass out=)."""
    x, dy = data((N, C), dt, 1), data((N, C), dt, 2)
    w, b = data((C,), dt, 3), data((C,), dt, 4)
    y = data((N, C), dt, 5, positive=True)
    y = (y / y.astype(F32).sum(-1, keepdims=True)).astype(dt)
    mean, inv = data((N,), dt, 6), data((N,), dt, 7, positive=True)
    m, v = data((N, C), F32, 8), data((N, C), F32, 9, positive=True)
    ln = {"num_groups": 1, "epsilon": 1e-5}
    adam = {"mode": "adam", "has_weight": True, "has_step": True, "epsilon": 1e-6, "beta1": 0.9,
            "beta2": 0.999, "bias_correction": True, "wd": 0.01}
    nc = [(s, dt) for s in [(N, C)]]
    yield "Gelu", {}, [x], nc, True
    yield "GeluGrad", {}, [dy, x], nc, True
    yield "Softmax", {"axis": -1}, [x], nc, True
    yield "SoftmaxGrad", {"axis": -1}, [dy, y], nc, True
    yield "GroupNormalization", ln, [x, w, b], nc + [((N,), dt), ((N,), dt)], True
    yield "GroupNormalizationGrad", ln, [dy, x, w, mean, inv], nc + [((C,), dt), ((C,), dt)], True
    yield ("NlllWithSoftmaxGradDirect", {"ignore_index": 3, "reduction": "mean"},
           [y, labels(10), np.float32(1.5)], [((), dt)] + nc, True)
    yield "Add", {}, [x, w], nc, True
    yield "Mul", {}, [x, dy], nc, True
    yield "Sum", {}, [x, dy, y], nc, True
    yield "Accumulate", {"mode": "moving_average", "f": 0.9}, [m.astype(dt), x], nc, False
    yield "AdamUpdater", adam, [x, m, v, np.zeros((), F32)], nc, True
    yield "ScaledAdd", {"a": 0.5, "b": -0.25}, [x, dy], nc, True
    yield "ScaledAddLhsInplace", {"a": 1.0, "b": -0.25}, [x, dy], nc, False
    yield "ScaledAddLhsInplace", {"a": 0.5, "b": -0.25}, [x, dy], nc, False
    yield "ReduceSum", {"axes": [0], "keepdims": False}, [x], [((C,), dt)], True
    yield ("ReduceSum", {"axes": [0, 1], "keepdims": True}, [x.reshape(10, 70, C)],
           [((1, 1, C), dt)], True)
    yield "Split", {"axis": 0, "splits": [300, 400]}, [x], [((300, C), dt), ((400, C), dt)], True
    yield "Concat", {"axis": 1}, [x, dy], [((N, 2 * C), dt)], True
    yield "Reshape", {}, [x.T], [((C * N,), dt)], True
    yield "MatMul", {}, [x, data((C, 300), dt, 11)], [((N, 300), dt)], True
    yield "MatMul", {}, [x.T, dy], [((C, C), dt)], True


def run(op, attrs, ins, outs, with_out, threads):
    fn = KERNELS[op].factory(attrs, [info(np.shape(a), np.asarray(a).dtype) for a in ins],
                             [info(*o) for o in outs])
    args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in ins]
    kw = {}
    if with_out and len(outs) == 1:
        kw["out"] = np.full(outs[0][0], np.nan, outs[0][1])
    elif with_out:
        kw["out"] = tuple(np.full(s, np.nan, d) for s, d in outs)
    with blas_threads(), parallel.threads(threads), np.errstate(all="ignore"):
        res = fn(*args, **kw)
    res = res if isinstance(res, tuple) else (res,)
    return [np.asarray(r).copy() for r in res] + [a for a in args if isinstance(a, np.ndarray)]


@pytest.mark.parametrize("dt", [F32, F16], ids=["float32", "float16"])
def test_same_bits_on_one_thread_and_three_and_really_parallel(dt, loops, monkeypatch):
    parallel_calls = []
    real = parallel.run_blocks

    def counting(n, fn):
        parallel_calls.append(n)
        return real(n, fn)

    for mod in (_blocks, _matmul_blocks):
        monkeypatch.setattr(mod, "run_blocks", counting)
    monkeypatch.setattr(_matmul_blocks, "GAIN", 1e9)       # split whatever the timings say
    monkeypatch.setattr(_matmul_blocks, "_VERDICTS", {})
    for op, attrs, ins, outs, with_out in cases(dt):
        one = run(op, attrs, ins, outs, with_out, 1)
        del parallel_calls[:]
        three = run(op, attrs, ins, outs, with_out, 3)
        # (a float32 sum over the rows is memory-bound: one thread, see `_blocks.column_sums`)
        if not (op == "ReduceSum" and dt == F32):
            assert any(n >= 2 for n in parallel_calls), (
                f"{op}: no blocks ran in parallel {parallel_calls}")
        for a, b in zip(one, three):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes(), f"{op} {dt}: bits differ on 3 threads"


def test_column_sums_equal_numpys_sum_over_rows():
    rng = np.random.default_rng(0)
    for n, c in [(1000, 128), (1024, 768), (300, 1000), (4096, 129), (257, 4096), (1, 70),
                 (5, 3)]:
        x = (rng.standard_normal((n, c)) * 1e3).astype(np.float32)
        x[:, 0] = -0.0                   # NumPy's sum starts from +0: -0.0 sums to +0.0
        want = np.sum(x, axis=0)
        for t in (1, 2, 5):
            with parallel.threads(t):
                got = _blocks.column_sums(x, np.empty(c, np.float32))
            assert got.tobytes() == want.tobytes(), (n, c, t)
