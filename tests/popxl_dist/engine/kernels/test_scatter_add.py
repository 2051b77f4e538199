"""scatter_add_rows: the bits of a sequential `out[idx[k]] += rows[k]` loop in index order, for
light destinations (added in passes) and heavy ones (summed by a running sum), and by the compiled
loop (numba) where it is in use."""
import numpy as np
import pytest

from popxl.engine.kernels import _util
from popxl.engine.kernels._scatter_add import scatter_add_rows


@pytest.fixture(params=["numpy", "compiled"], autouse=True)
def loops(request):
    """Every test on the NumPy passes and on the compiled loop (skipped without numba)."""
    if request.param == "numpy":
        _util.use_compiled_converters(False)
    elif _util.jit_loops() is None:
        pytest.skip("numba (the `fast` extra) is not installed")
    yield request.param
    _util.use_compiled_converters(None)


def _sequential(out, idx, rows):
    out = out.copy()
    for k in range(len(idx)):
        out[idx[k]] = out[idx[k]] + rows[k]
    return out


def _rows(rng, shape, dtype):
    """Values over many magnitudes, so a different summation order changes the bits."""
    return (rng.normal(size=shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(dtype)


@pytest.mark.parametrize("dest,n,inner,skew", [
    (7, 40, (3,), 0.3),            # below the small-size cut: np.add.at itself
    (128, 5000, (4,), 0.0),        # light destinations only: passes
    (32, 20000, (2,), 0.4),        # geometric: a few heavy destinations, a light tail
    (5, 4000, (2, 3), 0.9),        # nearly everything to destination 0
    (1000, 700, (), 0.0),          # scalar rows
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bits_of_a_sequential_loop(dest, n, inner, skew, dtype):
    rng = np.random.default_rng(dest + n)
    idx = (rng.integers(0, dest, n) if not skew else
           np.minimum(rng.geometric(skew, n) - 1, dest - 1)).astype(np.intp)
    rows = _rows(rng, (n,) + inner, dtype)
    base = _rows(rng, (dest,) + inner, dtype)
    want = _sequential(base, idx, rows)
    got = base.copy()
    scatter_add_rows(got, idx, rows)
    assert got.tobytes() == want.tobytes()
    by_pairs = base.copy()
    for d in np.unique(idx):     # a pairwise (np.sum) order differs somewhere: the test can fail
        by_pairs[d] = by_pairs[d] + rows[idx == d].sum(0)
    assert skew < 0.5 or by_pairs.tobytes() != want.tobytes()


def test_into_a_strided_view_and_signed_zeros():
    """`out` may be a non-contiguous view (a moved axis); 0.0 + -0.0 is +0.0 as in the loop."""
    rng = np.random.default_rng(3)
    n = 3000
    idx = np.minimum(rng.geometric(0.5, n) - 1, 9)
    rows = _rows(rng, (n, 4), np.float32)
    rows[idx == 9] = -0.0                       # a destination that only receives -0.0
    base = np.zeros((4, 10), np.float32)
    got = base.copy()
    scatter_add_rows(np.moveaxis(got, 1, 0), idx, rows)
    want = _sequential(base.T, idx, rows).T
    assert got.tobytes() == want.tobytes()
    assert not np.signbit(got[:, 9]).any()
