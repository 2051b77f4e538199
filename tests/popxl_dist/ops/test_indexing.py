"""Tensor.__getitem__ against NumPy indexing: basic keys, gather keys, bool masks, errors, grads."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import grads, numeric_grads, run_ops

RNG = np.random.default_rng(2)
X = RNG.normal(size=(4, 5, 6)).astype(np.float32)


@pytest.fixture(autouse=True)
def _float64_inputs(monkeypatch):
    """Let float64 host data reach float64 streams (upstream's run() downcasts it)."""
    run = popxl.Session.run
    monkeypatch.setattr(popxl.Session, "run",
                        lambda self, inputs=None, downcast_inputs=False: run(self, inputs, False))


S = slice
BASIC_KEYS = [
    1, -1, -4, 3,
    S(1, 3), S(None, -1), S(-2, None), S(None, None, -1), S(None, None, 2), S(3, 0, -2),
    S(-100, 100), S(3, 1), S(-100, None, -1), S(None, None, -3), S(1, None, 3),
    (0, 1), (-1, -1, -1), (S(None), 2), (1, S(None, None, -2), S(1, 5, 2)),
    (Ellipsis, 0), (Ellipsis, S(None, None, 4)), (0, Ellipsis, 5), (Ellipsis,),
    (S(None), S(None)), (2, S(1, 4), Ellipsis), (np.int64(2), np.int32(-2)),
]


@pytest.mark.parametrize("key", BASIC_KEYS, ids=repr)
def test_basic_key_matches_numpy(key):
    out, = run_ops(lambda t: t[key], X)
    want = X[key]
    assert out.shape == want.shape
    np.testing.assert_array_equal(out, want)


def test_last_element_follows_numpy_not_upstream_quirk():
    out, = run_ops(lambda t: t[-1], X[0, 0])
    assert out.shape == () and out == X[0, 0, -1]


def _types(fn):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(X, name="x")
        r = fn(t)
        return t, r, [op.type for op in ir.main_graph._data.ops]


@pytest.mark.parametrize("key,types", [
    ((S(None),), []),
    (1, ["Slice", "Reshape"]),
    (S(1, 3), ["Slice"]),
    (S(None, None, 2), ["Slice", "Subsample"]),
    ((0, S(None, None, -3)), ["Slice", "Subsample", "Reshape"]),
], ids=repr)
def test_basic_key_op_sequence(key, types):
    t, r, got = _types(lambda t: t[key])
    assert got == types
    if not types:
        assert r is t


INDEX_KEYS = [
    np.array([3, 0, 3], np.int32),
    np.array([[1, -1], [0, 2]], np.int64),
    [2, 1],
]


@pytest.mark.parametrize("key", INDEX_KEYS, ids=lambda k: repr(np.asarray(k).tolist()))
def test_integer_array_key_gathers(key):
    out, = run_ops(lambda t: t[key], X)
    np.testing.assert_array_equal(out, X[np.asarray(key)])
    _, _, got = _types(lambda t: t[key])
    assert got == ["Gather"]


def test_nested_list_keys_are_host_index_data_as_upstream():
    """Nested lists index as the array they make (upstream: a constant of them): ints gather,
    bools mask (broadcast); a ragged list is refused."""
    out, = run_ops(lambda t: t[[[0, 1], [1, 1]]], X)
    np.testing.assert_array_equal(out, X[np.array([[0, 1], [1, 1]])])
    assert out.shape == (2, 2, 5, 6)
    y = RNG.normal(size=(4, 2)).astype(np.float32)
    full = [[True, False], [True, False], [False, True], [True, True]]
    rows = [[True], [True], [False], [True]]
    out, out_b = run_ops(lambda t: (t[full], t[rows]), y)
    np.testing.assert_array_equal(out, np.where(np.array(full), y, 0))
    np.testing.assert_array_equal(out_b, np.where(np.array(rows), y, 0))
    with popxl.Ir().main_graph:
        t = popxl.variable(X, name="t")
        with pytest.raises(TypeError, match=r"unsupported key \[\[0, 1\], \[1\]\]"):
            t[[[0, 1], [1]]]


def test_integer_tensor_key_gathers():
    idx = np.array([[0, 2], [3, 3]], np.int32)
    out, = run_ops(lambda t, i: t[i], X, idx)
    np.testing.assert_array_equal(out, X[idx])


def test_bool_tensor_key_masks():
    if not hasattr(ops, "where"):
        pytest.skip("ops.where is not available yet")
    mask = RNG.random((5, 6)) > 0.5
    out, = run_ops(lambda t, m: t[m], X, mask)
    np.testing.assert_array_equal(out, np.where(mask, X, 0))
    out, = run_ops(lambda t: t[mask], X)
    np.testing.assert_array_equal(out, np.where(mask, X, 0))


@pytest.mark.parametrize("key", [S(1, 3), (1, S(None, None, -2)), np.array([2, 0, 2], np.int32)],
                         ids=repr)
def test_getitem_grad(key):
    x = RNG.normal(size=(4, 3))
    fn = lambda t: t[key]  # noqa: E731
    dy = RNG.normal(size=np.shape(x[key]))
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, numeric_grads(fn, [x], [dy])[0], atol=1e-6)


ERRORS = [
    (True, TypeError, r"unsupported key True \(type bool\)"),
    ("a", TypeError, r"unsupported key 'a' \(type str\)"),
    (1.5, TypeError, r"unsupported key 1.5 \(type float\)"),
    ((0, None), TypeError, r"unsupported key \(0, None\)"),
    (np.array([0.5]), TypeError, "unsupported key"),
    ((0, 0, 0, 0), IndexError, r"too many indices for a tensor of shape \(4, 5, 6\)"),
    ((Ellipsis, 0, Ellipsis), IndexError, "single ellipsis"),
    (4, IndexError, "index 4 is out of range for axis 0 with size 4"),
    ((0, -6), IndexError, "index -6 is out of range for axis 1 with size 5"),
]


@pytest.mark.parametrize("key,exc,match", ERRORS, ids=lambda e: repr(e)[:30])
def test_bad_keys(key, exc, match):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(X, name="x")
        with pytest.raises(exc, match=match):
            t[key]


def test_float_tensor_key_is_refused():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(X, name="x")
        k = popxl.constant(np.float32([0.0]), name="k")
        with pytest.raises(TypeError, match="index tensor must be integer .* got 'k' float32"):
            t[k]


def test_not_exported():
    import popxl.ops.indexing as indexing

    assert indexing.__all__ == [] and "tensor_getitem" not in ops.__all__
