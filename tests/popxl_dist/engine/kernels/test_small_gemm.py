"""The thin float32 products (`_small_gemm`): each element is the documented chain of IEEE
operations (checked against the chain emulated here in extended precision), for any operand
layout, output, block split and thread count; which products take these kernels depends on
shapes and layouts only; floating-point checks still raise."""
import numpy as np
import pytest

from popxl.engine.kernels import _matmul_blocks as mb
from popxl.engine.kernels import _small_gemm as sg
from popxl.engine.kernels._util import fp_events
from popxl.engine.parallel import threads

rng = np.random.default_rng(11)
F32 = np.float32
EXT = np.longdouble

pytestmark = pytest.mark.skipif(np.finfo(EXT).nmant < 63,
                                reason="the reference needs an 80-bit long double")


@np.errstate(invalid="ignore")
def fma(a, b, c):
    """float32 fma: a * b is exact in 64 bits of mantissa, the sum is rounded once to 64 bits
    and then to float32 (a second rounding that lands on a float32 tie: ~2^-39 per operation)."""
    return (a.astype(EXT) * b.astype(EXT) + c.astype(EXT)).astype(F32)


def gemm_reference(a, b):
    """c = a0 * b0, then c = fma(ak, bk, c) for k = 1 .. K-1."""
    c = (a[:, :1] * b[:1, :]).astype(F32)
    for k in range(1, a.shape[1]):
        c = fma(a[:, k:k + 1], b[k:k + 1, :], c)
    return c


def dot_reference(a, w):
    """Per element: 16 lane sums s_l = a_l w_l, s_l = fma(a_{l+16t}, w_{l+16t}, s_l) over K padded
    with zeros, then the lanes added as a tree (l + 8, then + 4, + 2, + 1)."""
    m, k = a.shape
    kp = -(-k // 16) * 16
    ap = np.zeros((m, kp), F32)
    ap[:, :k] = a
    wp = np.zeros((w.shape[0], kp), F32)
    wp[:, :k] = w
    s = (ap[:, None, :16] * wp[None, :, :16]).astype(F32)             # (m, n, 16)
    for t in range(1, kp // 16):
        s = fma(ap[:, None, 16 * t:16 * t + 16], wp[None, :, 16 * t:16 * t + 16], s)
    while s.shape[-1] > 1:
        h = s.shape[-1] // 2
        s = (s[..., :h] + s[..., h:]).astype(F32)
    return s[..., 0]


def operand(rows, cols, layout):
    if layout == "C":
        return rng.standard_normal((rows, cols)).astype(F32)
    if layout == "F":
        return rng.standard_normal((cols, rows)).astype(F32).T
    return rng.standard_normal((rows, cols + 37)).astype(F32)[:, 5:5 + cols]      # "S"


GEMM_SHAPES = [(8, 784, 512), (1, 2000, 300), (13, 100, 333), (16, 129, 200), (3, 70, 1500),
               (784, 8, 512), (100, 1, 4000), (40, 16, 1000)]


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
@pytest.mark.parametrize("la,lb", [("C", "C"), ("F", "C"), ("S", "S")])
def test_gemm_is_one_fma_chain_per_element_for_any_threads(m, k, n, la, lb):
    a, b = operand(m, k, la), operand(k, n, lb)
    assert sg.handles(a, b) == "gemm"
    want = gemm_reference(a, b)
    for t in (1, 2, 3, 4):
        with threads(t):
            assert mb.matmul(a, b).tobytes() == want.tobytes(), t
            out = np.full((m, n + 3), np.nan, F32)[:, 2:2 + n]       # rows apart, unaligned
            assert mb.matmul(a, b, out=out) is out
            assert out.tobytes() == want.tobytes(), t
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(want, exact, rtol=1e-4, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("m,k,n", [(8, 512, 512), (1, 4096, 70), (5, 37, 2000), (8, 1000, 33),
                                   (2, 16, 20000)])
def test_dot_is_lane_sums_and_a_fixed_tree_for_any_threads(m, k, n):
    a, w = operand(m, k, "C"), operand(n, k, "C")
    assert sg.handles(a, w.T) == "dot"
    want = dot_reference(a, w)
    for t in (1, 2, 3):
        with threads(t):
            assert mb.matmul(a, w.T).tobytes() == want.tobytes(), t
    exact = a.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(want, exact, rtol=1e-4, atol=1e-5 * np.sqrt(k))


def test_which_products_take_which_kernel():
    c, f = "C", "F"
    assert sg.handles(operand(16, 512, c), operand(512, 512, c)) == "gemm"
    assert sg.handles(operand(17, 512, c), operand(512, 512, c)) is None      # rows: BLAS
    assert sg.handles(operand(512, 16, f), operand(16, 512, c)) == "gemm"     # short K
    assert sg.handles(operand(512, 16, f), operand(16, 15, c)) is None        # ... too few cols
    assert sg.handles(operand(8, 512, c), operand(512, 512, f)) == "dot"      # dy @ w.T
    assert sg.handles(operand(9, 512, c), operand(512, 512, f)) is None       # swapped, BLAS
    assert sg.handles(operand(9, 300, c), operand(300, 100, f)) == "gemm"     # packed B
    assert sg.handles(operand(8, 64, c), operand(64, 64, c)) is None          # tiny: BLAS
    assert sg.handles(operand(8, 512, c).astype(np.float64),
                      operand(512, 512, c).astype(np.float64)) is None
    assert sg.handles(operand(8, 512, c), operand(512, 512, c)[::2]) is None  # K mismatch
    strided = np.zeros((512, 1024), F32)[:, ::2]                               # column stride 2
    assert sg.handles(operand(8, 512, c), strided) is None


def test_special_values_follow_the_chain():
    a = operand(4, 300, "C")
    b = operand(300, 600, "C")
    a[0, 0] = np.inf
    a[1, 5] = np.nan
    b[7, :] = 0.0
    a[2, 7] = np.inf                                   # inf * 0: NaN in row 2
    a[3] = -0.0
    got = sg.small_gemm(a, b, "gemm")
    want = gemm_reference(a, b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[2]).all() and np.isnan(got[1]).all()
    finite = ~np.isnan(want)
    assert got[finite].tobytes() == want[finite].tobytes()


def test_output_sharing_an_operand_is_computed_aside():
    buf = rng.standard_normal((8, 600)).astype(F32)
    a = buf[:, :512]
    b = operand(512, 512, "C")
    want = gemm_reference(a.copy(), b)
    out = buf[:, 88:]                                   # overlaps a
    sg.small_gemm(a, b, "gemm", out)
    assert out.tobytes() == want.tobytes()


def test_overflow_raises_with_floating_point_checks():
    a = np.full((8, 512), 1e30, F32)
    b = np.full((512, 512), 1e30, F32)
    with fp_events(dict(all="ignore")):
        assert np.isinf(mb.matmul(a, b)).all()
    with fp_events(dict(divide="raise", over="raise", invalid="raise", under="ignore")):
        with pytest.raises(FloatingPointError, match="overflow"):
            mb.matmul(a, b)


def test_without_numpys_array_layout_the_pointers_are_passed_by_value(monkeypatch):
    """Where NumPy's array struct cannot be confirmed, the same kernels are called with
    pointers and strides from Python: the same bits."""
    a, b, w = operand(8, 300, "S"), operand(300, 700, "C"), operand(500, 300, "C")
    fast = sg.small_gemm(a, b, "gemm"), sg.small_gemm(a, w.T, "dot")
    monkeypatch.setattr(sg, "_COMPILED", {})
    monkeypatch.setattr(sg, "_array_offsets", lambda: None)
    slow = sg.small_gemm(a, b, "gemm"), sg.small_gemm(a, w.T, "dot")
    assert [x.tobytes() for x in fast] == [x.tobytes() for x in slow]


def test_machine_code_is_cached_on_disk_and_a_torn_file_recompiled(monkeypatch, tmp_path):
    a, b = operand(8, 300, "C"), operand(300, 700, "C")
    want = sg.small_gemm(a, b, "gemm").tobytes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sg, "_COMPILED", {})
    assert sg.small_gemm(a, b, "gemm").tobytes() == want                 # compiled, stored
    (path,) = (tmp_path / "popxl-dist" / "kernels").iterdir()
    stored = path.read_bytes()
    assert len(stored) > 1000
    monkeypatch.setattr(sg, "_COMPILED", {})
    assert sg.small_gemm(a, b, "gemm").tobytes() == want                 # loaded
    path.write_bytes(stored[:len(stored) // 2])                          # torn
    monkeypatch.setattr(sg, "_COMPILED", {})
    assert sg.small_gemm(a, b, "gemm").tobytes() == want                 # compiled again
    assert path.read_bytes() == stored
