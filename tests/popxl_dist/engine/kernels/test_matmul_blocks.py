"""MatMul in blocks on the op threads gives the bits of the single call (NumPy's; for thin
float32 products `_small_gemm`'s kernel on one thread: `single_call`), for every shape
class BLAS treats differently (matrix-vector, its small-matrix and direct kernels, M / N tails,
K blocking, transposed and strided operands, batched and broadcast products), with any number
of threads; splits never cut K, start at multiples of 64 and are really used where they match."""
import numpy as np
import pytest

from popxl.engine.kernels import _matmul_blocks as mb
from popxl.engine.kernels._small_gemm import handles as small_product, small_gemm
from popxl.engine.parallel import threads
from popxl.runtime.blas import blas_threads

rng = np.random.default_rng(3)


def operand(rows, cols, layout, dtype=np.float32):
    """(rows, cols) in memory as C (row-major), F (a transposed row-major array) or S (a slice of
    a wider row-major array: leading dimension > cols)."""
    if layout == "C":
        return rng.standard_normal((rows, cols)).astype(dtype)
    if layout == "F":
        return rng.standard_normal((cols, rows)).astype(dtype).T
    return rng.standard_normal((rows, cols + 37)).astype(dtype)[:, 5:5 + cols]


def single_call(a, b):
    """The product as one call: np.matmul(a, b); for the thin products `_small_gemm` takes, its
    kernel on one thread (its own bits: `test_small_gemm.py`); for the few-rows-times-a-
    transpose products `mb.swapped` picks, np.matmul(b.T, a.T) transposed."""
    kind = small_product(a, b)
    if kind is not None:
        return small_gemm(a, b, kind)
    if mb.swapped(a, b):
        return np.ascontiguousarray(np.matmul(b.T, a.T).T)
    return np.matmul(a, b)


SHAPES_2D = [
    (1, 784, 512), (512, 784, 1), (2, 256, 4096),         # matrix-vector and near it
    (8, 784, 512), (64, 784, 512), (100, 256, 100),        # small / direct kernels, tails
    (16, 256, 100), (100, 64, 1000), (1000, 64, 100),
    (512, 64, 256), (1024, 256, 768), (1024, 1024, 256),   # packed kernel, K blocking
    (256, 2000, 192), (1000, 900, 129), (130, 449, 1031),
]


@pytest.mark.parametrize("m,k,n", SHAPES_2D)
@pytest.mark.parametrize("layouts", ["CC", "CF", "FC", "SF"])
def test_2d_bits_equal_the_single_call_for_any_thread_count(m, k, n, layouts):
    a, b = operand(m, k, layouts[0]), operand(k, n, layouts[1])
    with blas_threads():
        want = single_call(a, b)
        for t in (1, 2, 3, 4):
            with threads(t):
                got = mb.matmul(a, b, out=np.full((m, n), np.nan, np.float32))
                assert got.tobytes() == want.tobytes(), (t, m, k, n, layouts)
                assert mb.matmul(a, b).tobytes() == want.tobytes()


@pytest.mark.parametrize("m,k,n", [(12, 256, 1024), (24, 512, 784), (32, 4096, 256),
                                   (16, 1024, 2048)])
def test_a_few_rows_times_a_transpose_run_swapped(m, k, n):
    """`dy @ w.T` at 9-32 rows runs as `(w @ dy.T).T` (OpenBLAS: 1.4-2.2x faster), for any
    thread count; the same values to float32 rounding. (At 8 rows or fewer `_small_gemm`'s
    dot kernel takes it.)"""
    a, b = operand(m, k, "C"), operand(k, n, "F")
    assert mb.swapped(a, b) and small_product(a, b) is None
    with blas_threads():
        want = np.ascontiguousarray(np.matmul(b.T, a.T).T)
        for t in (1, 2, 3):
            with threads(t):
                assert mb.matmul(a, b).tobytes() == want.tobytes()
                out = np.full((m, n), np.nan, np.float32)
                assert mb.matmul(a, b, out=out) is out and out.tobytes() == want.tobytes()
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(want, exact, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_only_a_few_rows_times_a_transpose_are_swapped():
    assert not mb.swapped(operand(8, 512, "C"), operand(512, 784, "C"))     # not transposed
    assert not mb.swapped(operand(8, 512, "F"), operand(512, 784, "F"))     # a transposed
    assert not mb.swapped(operand(64, 512, "C"), operand(512, 784, "F"))    # too many rows
    assert not mb.swapped(operand(1, 512, "C"), operand(512, 784, "F"))     # matrix-vector
    assert not mb.swapped(operand(4, 64, "C"), operand(64, 64, "F"))        # small
    assert not mb.swapped(operand(8, 512, "C", np.float16), operand(512, 784, "F", np.float16))
    # few rows on both sides: not swapped (the swapped product would qualify again)
    a, b = operand(16, 4096, "C"), operand(4096, 16, "F")
    assert not mb.swapped(a, b) and not mb.swapped(b.T, a.T)
    with blas_threads(), threads(2):
        assert mb.matmul(a, b).tobytes() == single_call(a, b).tobytes()


def test_float64_and_integer_products():
    with blas_threads(), threads(4):
        a, b = operand(512, 300, "C", np.float64), operand(300, 640, "F", np.float64)
        assert mb.matmul(a, b).tobytes() == np.matmul(a, b).tobytes()
        ai = rng.integers(-9, 9, (300, 200)).astype(np.int32)
        bi = rng.integers(-9, 9, (200, 500)).astype(np.int32)
        assert (mb.matmul(ai, bi) == np.matmul(ai, bi)).all()


@pytest.mark.parametrize("a_shape,b_shape", [
    ((8, 8, 128, 32), (8, 8, 32, 128)),      # attention scores
    ((8, 8, 128, 128), (8, 8, 128, 32)),
    ((1, 8, 128, 64), (8, 1, 64, 96)),       # broadcast batch axes
    ((512, 300), (6, 300, 200)),             # a 2-D operand against a batch
    ((6, 1, 300), (6, 300, 1)),              # per-item matrix-vector
    ((3, 256, 256), (256, 256)),
])
def test_batched_bits_equal_the_single_call(a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, b)
    with blas_threads():
        for t in (1, 2, 4):
            with threads(t):
                assert mb.matmul(a, b).tobytes() == want.tobytes()
                out = np.empty(want.shape, np.float32)
                assert mb.matmul(a, b, out=out) is out and out.tobytes() == want.tobytes()


def test_plans_cut_m_or_n_at_multiples_of_64_never_k():
    for m, k, n, blocks in [(1024, 256, 768, 2), (1024, 256, 768, 8), (200, 4096, 3000, 4),
                            (130, 5000, 129, 16)]:
        plans = mb.plan_2d(m, k, n, blocks)
        assert plans
        axis0, ranges0 = plans[0]
        assert axis0 == (0 if m // 64 >= n // 64 else 1)        # the longer of M and N first
        for axis, ranges in plans:
            dim = m if axis == 0 else n
            assert ranges[0][0] == 0 and ranges[-1][1] == dim and len(ranges) <= blocks
            assert all(lo % 64 == 0 and hi - lo >= 64 for lo, hi in ranges)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert mb.plan_2d(1024, 256, 768, 1) == []                   # one thread: no split
    assert mb.plan_2d(64, 64, 64, 8) == []                       # too small to gain
    axis, ranges = mb.plan_batched((8, 8, 128, 128), 32)
    assert axis == 0 and ranges == tuple((i, i + 1) for i in range(8))
    assert mb.plan_batched((1, 1, 512, 512), 512) is None


def test_big_products_really_split_on_several_threads(monkeypatch):
    monkeypatch.setattr(mb, "GAIN", 1e9)          # split whatever the timings say
    monkeypatch.setattr(mb, "_VERDICTS", {})
    calls = []
    real = mb.run_blocks
    monkeypatch.setattr(mb, "run_blocks", lambda n, fn: (calls.append(n), real(n, fn)))
    a, b = operand(1024, 256, "C"), operand(256, 768, "F")
    with blas_threads():
        with threads(1):
            mb.matmul(a, b)
        assert calls == []                                       # 1 thread: the single call
        with threads(2):
            mb.matmul(a, b)                 # the first: the trial times the split as it runs
            del calls[:]
            mb.matmul(a, b)
            mb.matmul(rng.standard_normal((8, 8, 128, 32)).astype(np.float32),
                      rng.standard_normal((8, 8, 32, 128)).astype(np.float32))
    assert calls == [2, 8]


def test_a_split_that_changes_the_bits_is_not_used(monkeypatch):
    """Where BLAS computes a block differently from that part of the single call, the check
    rejects every candidate and the product runs as the single call."""
    key = ("f", 1088, 300, 704, ("C", 300), ("C", 704), 2)
    mb._VERDICTS.pop(key, None)
    monkeypatch.setattr(mb, "_split", lambda a, b, plan: np.matmul(a, b) + np.float32(1))
    calls = []
    monkeypatch.setattr(mb, "run_blocks", lambda n, fn: calls.append(n))
    a, b = operand(1088, 300, "C"), operand(300, 704, "C")
    try:
        with blas_threads(), threads(2):
            got = mb.matmul(a, b)
        assert mb._VERDICTS[key] is None and calls == []
        assert got.tobytes() == np.matmul(a, b).tobytes()
    finally:
        mb._VERDICTS.pop(key, None)


def test_a_times_its_own_transpose_is_left_to_numpy():
    """NumPy computes A @ A.T with its own symmetric routine: never split."""
    a = operand(1024, 512, "C")
    with blas_threads(), threads(4):
        assert mb.matmul(a, a.T).tobytes() == np.matmul(a, a.T).tobytes()


def test_a_split_slower_than_the_single_call_is_not_used(monkeypatch):
    """Blocks that BLAS computes more slowly than the whole product (another kernel path) are
    not worth the threads: the product then runs as the single call (same bits either way)."""
    monkeypatch.setattr(mb, "_VERDICTS", {})
    monkeypatch.setattr(mb, "GAIN", 0.0)          # no split can promise a gain
    calls = []
    monkeypatch.setattr(mb, "run_blocks", lambda n, fn: calls.append(n))
    a, b = operand(1024, 256, "C"), operand(256, 768, "C")
    with blas_threads(), threads(2):
        assert mb.matmul(a, b).tobytes() == np.matmul(a, b).tobytes()   # the trial
        del calls[:]
        assert mb.matmul(a, b).tobytes() == np.matmul(a, b).tobytes()
    assert calls == [] and list(mb._VERDICTS.values()) == [None]


def test_the_fastest_split_that_keeps_the_bits_is_used(monkeypatch):
    """Every candidate with the single call's bits is timed as it runs on the threads; the
    fastest is kept (here the column split, whatever BLAS's own timings)."""
    import time

    monkeypatch.setattr(mb, "_VERDICTS", {})
    monkeypatch.setattr(mb, "GAIN", 1e9)
    real = mb._run_split

    def timed(a, b, plan, out):
        if plan[0] == 0:
            time.sleep(0.02)                       # row blocks: slow (5x the product)
        real(a, b, plan, out)
    monkeypatch.setattr(mb, "_run_split", timed)
    a, b = operand(1024, 256, "C"), operand(256, 1024, "C")
    with blas_threads(), threads(2):
        assert mb.matmul(a, b).tobytes() == np.matmul(a, b).tobytes()
    (plan,) = mb._VERDICTS.values()
    assert plan is not None and plan[0] == 1
