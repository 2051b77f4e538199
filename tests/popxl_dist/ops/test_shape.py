"""Shape, data-movement and gather/scatter ops against NumPy; gradients against finite differences
(float64); builder errors."""
from __future__ import annotations

from typing import Callable, List, NamedTuple

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import (check_forward, check_grads, check_image_builder_error, grads,
                     numeric_grads, run_ops)

RNG = np.random.default_rng(1)


@pytest.fixture(autouse=True)
def _float64_inputs(monkeypatch):
    """Let float64 host data reach float64 streams (upstream's run() downcasts it)."""
    run = popxl.Session.run
    monkeypatch.setattr(popxl.Session, "run",
                        lambda self, inputs=None, downcast_inputs=False: run(self, inputs, False))


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


# --- NumPy references ------------------------------------------------------------------------
def _scatter_ref(t, idx, v, axis):
    out = t.copy()
    for pos in np.ndindex(idx.shape):
        tgt = list(pos)
        tgt[axis] = idx[pos]
        out[tuple(tgt)] = v[pos]
    return out


def _scatter_reduce_ref(data, idx, red, size, axis, init=None):
    shape = list(data.shape)
    shape[axis] = size
    idx = np.broadcast_to(idx.reshape((1,) * axis + idx.shape + (1,) * (data.ndim - axis - 1))
                          if idx.ndim == 1 else idx, data.shape)
    out = np.zeros(shape, data.dtype) if init is None else init.copy()
    seen = np.zeros(shape, bool)
    for pos in np.ndindex(data.shape):
        tgt = list(pos)
        tgt[axis] = idx[pos]
        tgt = tuple(tgt)
        v = data[pos]
        if red == "none" or (init is None and not seen[tgt] and red != "sum"):
            out[tgt] = v
        elif red == "sum":
            out[tgt] += v
        elif red == "max":
            out[tgt] = max(out[tgt], v)
        else:
            out[tgt] = min(out[tgt], v)
        seen[tgt] = True
    return out


def _onehot_ref(idx, depth, values, axis):
    out = np.full(idx.shape + (depth,), values[0], values.dtype)
    for pos in np.ndindex(idx.shape):
        i = idx[pos] + depth if idx[pos] < 0 else idx[pos]
        if 0 <= i < depth:
            out[pos + (i,)] = values[1]
    return np.moveaxis(out, -1, axis)


def _dyn_slice_ref(t, starts, axes, sizes):
    idx = [slice(None)] * t.ndim
    for b, a, s in zip(starts, axes, sizes):
        b = int(np.clip(b, 0, t.shape[a] - s))
        idx[a] = slice(b, b + s)
    return tuple(idx)


def _dyn_update_ref(t, starts, upd, axes, sizes):
    out = t.copy()
    out[_dyn_slice_ref(t, starts, axes, sizes)] = upd
    return out


def _const(x):
    return popxl.constant(x)


# --- forward table ---------------------------------------------------------------------------
class Case(NamedTuple):
    id: str
    fn: Callable            # tensors -> Tensor | list
    ref: Callable           # arrays -> array | list
    inputs: List[np.ndarray]
    grad: bool = True       # also check the gradient of the float inputs


X = RNG.normal(size=(3, 4, 5)).astype(np.float32)
X2 = RNG.normal(size=(2, 3)).astype(np.float32)
S1 = RNG.normal(size=(2, 1, 3, 1)).astype(np.float32)
I32 = np.int32
U32 = np.uint32

CASES = [
    Case("squeeze_all", ops.squeeze, np.squeeze, [S1]),
    Case("squeeze_axis", lambda t: ops.squeeze(t, [1]), lambda x: np.squeeze(x, 1), [S1]),
    Case("squeeze_neg", lambda t: ops.squeeze(t, -1), lambda x: np.squeeze(x, -1), [S1]),
    Case("slice_axis1", lambda t: ops.slice(t, 1, 3, axis=1), lambda x: x[:, 1:3], [X]),
    Case("slice_lists", lambda t: ops.slice(t, [0, 1], [2, 5], [1, 2], [0, 2]),
         lambda x: x[0:2, :, 1:5:2], [X]),
    Case("slice_default_axes", lambda t: ops.slice(t, [1, 1], [3, 3]),
         lambda x: x[1:3, 1:3], [X]),
    Case("slice_clamp", lambda t: ops.slice(t, -100, 100, axis=2), lambda x: x[:, :, :], [X]),
    Case("slice_negative", lambda t: ops.slice(t, -3, -1, axis=-1), lambda x: x[..., -3:-1],
         [X]),
    Case("slice_neg_step", lambda t: ops.slice(t, step=-1, axis=1), lambda x: x[:, ::-1], [X]),
    Case("slice_neg_step_range", lambda t: ops.slice(t, 3, 0, -2, 2),
         lambda x: x[:, :, 3:0:-2], [X]),
    Case("slice_neg_step_int_min", lambda t: ops.slice(t, 2, -2 ** 63, -1, 0),
         lambda x: x[2::-1], [X]),
    Case("slice_empty", lambda t: ops.slice(t, 3, 1, axis=0), lambda x: x[3:1], [X]),
    Case("slice_", lambda t: ops.slice_(t, 1, 3, axis=1), lambda x: x[:, 1:3], [X]),
    Case("subsample_int", lambda t: ops.subsample(t, 2), lambda x: x[::2], [X]),
    Case("subsample_list", lambda t: ops.subsample(t, [1, 3, 2]), lambda x: x[:, ::3, ::2],
         [X]),
    Case("split_int", lambda t: ops.split(t, 2, 1), lambda x: np.split(x, 2, 1), [X]),
    Case("split_sizes", lambda t: ops.split(t, [1, 3, 1], -1),
         lambda x: np.split(x, [1, 4], -1), [X]),
    Case("concat0", lambda a, b: ops.concat([a, b]), lambda a, b: np.concatenate([a, b]),
         [X2, X2 + 1]),
    Case("concat_neg", lambda a, b, c: ops.concat([a, b, c], -1),
         lambda a, b, c: np.concatenate([a, b, c], -1), [X2, X2 * 2, X2[:, :1]]),
    Case("concat_", lambda a, b: ops.concat_([a, b], 1), lambda a, b: np.concatenate([a, b], 1),
         [X2, X2 - 1]),
    Case("gather_1d", lambda t, i: ops.gather(t, i), lambda x, i: np.take(x, i, 0),
         [X, np.array([2, 0, 2], I32)]),
    Case("gather_2d_axis1", lambda t, i: ops.gather(t, i, 1), lambda x, i: np.take(x, i, 1),
         [X, np.array([[3, 0], [1, 1]], U32)]),
    Case("gather_negative", lambda t, i: ops.gather(t, i, -1), lambda x, i: np.take(x, i, -1),
         [X, np.array([-1, 0], I32)]),
    Case("gather_scalar_index", lambda t, i: ops.gather(t, i, 1), lambda x, i: np.take(x, i, 1),
         [X, np.array(2, I32)]),
    Case("gather_zero_OOR", lambda t, i: ops.gather(t, i, 1, zero_OOR=True),
         lambda x, i: np.where(((i >= 0) & (i < 4))[None, :, None],
                               np.take(x, np.clip(i, 0, 3), 1), 0),
         [X, np.array([0, 7, 3, -2], I32)]),
    Case("tied_gather", lambda t, i: ops.tied_gather(t, i), lambda x, i: np.take(x, i, 0),
         [X, np.array([1, 1, 0], I32)]),
    Case("groupedgather", lambda t, i: ops.groupedgather(t, i, 1, group_size=3),
         lambda x, i: np.stack([np.take(x[g], i[g], 0) for g in range(3)]),
         [X, np.array([[0, 3], [2, 2], [1, 0]], I32)]),
    Case("scatter_axis0", lambda t, i, v: ops.scatter(t, i, v),
         lambda t, i, v: _scatter_ref(t, i, v, 0),
         [X2, np.array([[1, 0, 1]], I32), np.array([[9.0, 8.0, 7.0]], np.float32)]),
    Case("scatter_axis1", lambda t, i, v: ops.scatter(t, i, v, axis=1),
         lambda t, i, v: _scatter_ref(t, i, v, 1),
         [X2, np.array([[2, 0], [1, 2]], I32), np.array([[1., 2.], [3., 4.]], np.float32)]),
    Case("scatter_reduce_sum", lambda d, i: ops.scatter_reduce(d, i, "sum", axis_size=3),
         lambda d, i: _scatter_reduce_ref(d, i, "sum", 3, 0),
         [RNG.normal(size=(5, 2)).astype(np.float32), np.array([0, 2, 0, 2, 1], I32)]),
    Case("scatter_reduce_max", lambda d, i: ops.scatter_reduce(d, i, "max", axis_size=4),
         lambda d, i: _scatter_reduce_ref(d, i, "max", 4, 0),
         [RNG.normal(size=(5, 2)).astype(np.float32), np.array([0, 2, 0, 2, 1], I32)]),
    Case("scatter_reduce_min_axis1",
         lambda d, i: ops.scatter_reduce(d, i, "min", axis=1, axis_size=2),
         lambda d, i: _scatter_reduce_ref(d, i, "min", 2, 1),
         [RNG.normal(size=(2, 4)).astype(np.float32), np.array([[0, 1, 1, 0], [1, 1, 1, 0]],
                                                               I32)]),
    Case("scatter_reduce_init", lambda d, i, v: ops.scatter_reduce(d, i, "max", v),
         lambda d, i, v: _scatter_reduce_ref(d, i, "max", 3, 0, v),
         [RNG.normal(size=(4, 2)).astype(np.float32), np.array([0, 2, 0, 0], I32),
          RNG.normal(size=(3, 2)).astype(np.float32)]),
    Case("scatter_reduce_none", lambda d, i, v: ops.scatter_reduce(d, i, "none", v),
         lambda d, i, v: _scatter_reduce_ref(d, i, "none", 3, 0, v),
         [RNG.normal(size=(2, 2)).astype(np.float32), np.array([2, 0], I32),
          RNG.normal(size=(3, 2)).astype(np.float32)]),
    Case("dynamic_slice", lambda t, i: ops.dynamic_slice(t, i, [0, 2], [2, 3], False),
         lambda t, i: t[_dyn_slice_ref(t, i, [0, 2], [2, 3])],
         [X, np.array([1, 1], U32)]),
    Case("dynamic_slice_clamped", lambda t, i: ops.dynamic_slice(t, i, [1], [3], False),
         lambda t, i: t[_dyn_slice_ref(t, i, [1], [3])], [X, np.array([3], U32)]),
    Case("dynamic_update", lambda t, i, u: ops.dynamic_update(t, i, u, [1], [2], False),
         lambda t, i, u: _dyn_update_ref(t, i, u, [1], [2]),
         [X, np.array([2], U32), RNG.normal(size=(3, 2, 5)).astype(np.float32)]),
    Case("dynamic_update_", lambda t, i, u: ops.dynamic_update_(t, i, u, [0, 1], [1, 2], False),
         lambda t, i, u: _dyn_update_ref(t, i, u, [0, 1], [1, 2]),
         [X, np.array([2, 0], U32), RNG.normal(size=(1, 2, 5)).astype(np.float32)], False),
    Case("onehot_last", lambda i, v: ops.onehot(i, _const(np.int32(4)), v, -1),
         lambda i, v: _onehot_ref(i, 4, v, -1),
         [np.array([[0, 3], [-1, 7]], I32), np.array([0.5, 2.0], np.float32)]),
    Case("onehot_axis0", lambda i, v: ops.onehot(i, _const(3), v, 0),
         lambda i, v: _onehot_ref(i, 3, v, 0),
         [np.array([2, 0, 1, 1], I32), np.array([-1.0, 1.0], np.float32)]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_numpy(case):
    outs = run_ops(lambda *ts: case.fn(*ts), *case.inputs)
    want = _as_list(case.ref(*[a.copy() for a in case.inputs]))
    assert len(outs) == len(want)
    for o, w in zip(outs, want):
        assert o.shape == np.shape(w) and o.dtype == w.dtype
        np.testing.assert_allclose(o, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=lambda c: c.id)
def test_grad_matches_finite_differences(case):
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in case.inputs]
    outs = run_ops(lambda *ts: case.fn(*ts), *arrays)
    dys = [RNG.normal(size=o.shape) for o in outs]
    _, dxs = grads(lambda *ts: case.fn(*ts), arrays, dys)
    want = numeric_grads(lambda *ts: case.fn(*ts), arrays, dys)
    assert len(dxs) == len(want) > 0
    for dx, w in zip(dxs, want):
        np.testing.assert_allclose(dx, w, rtol=1e-5, atol=1e-6)


def test_split_grad_with_unused_output():
    x = RNG.normal(size=(4, 3))
    _, (dx,) = grads(lambda t: ops.split(t, 2)[1], [x], [np.ones((2, 3))])
    np.testing.assert_array_equal(dx, [[0] * 3] * 2 + [[1] * 3] * 2)


def test_gather_grad_accumulates_repeated_indices():
    x = RNG.normal(size=(3, 2))
    idx = np.array([2, 2, 0, 2], I32)
    _, (dx,) = grads(lambda t, i: ops.gather(t, i), [x, idx], [np.ones((4, 2))])
    np.testing.assert_array_equal(dx, [[1, 1], [0, 0], [3, 3]])


def _gather_grad_ref(dy, idx, dim, axis, dtype):
    """dx of gather(t, idx, axis): dy's slices added one at a time in index order (NumPy's
    negative indices; out-of-range ones give no gradient)."""
    shape = dy.shape[:axis] + (dim,) + dy.shape[axis + idx.ndim:]
    dx = np.zeros(shape, dtype)
    for pos in np.ndindex(idx.shape):
        i = int(idx[pos])
        if -dim <= i < dim:
            src = (slice(None),) * axis + pos
            dst = (slice(None),) * axis + (i % dim,)
            dx[dst] = dx[dst] + dy[src].astype(dtype)
    return dx


@pytest.mark.parametrize("axis,idx_shape,dim,oor", [
    (0, (600,), 5, False),          # an embedding table with many repeated rows
    (1, (24, 25), 7, False),        # 2-D indices (T5's relative-position buckets) on axis 1
    (0, (300,), 4, True),           # negative and out-of-range indices
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_grad_is_a_sequential_sum_in_index_order(axis, idx_shape, dim, oor, dtype):
    rng = np.random.default_rng(dim)
    idx = np.minimum(rng.geometric(0.35, idx_shape) - 1, dim - 1).astype(I32)
    if oor:
        idx[::7] = -1
        idx[::11] = dim + 3
    x = rng.normal(size=(3,) * axis + (dim, 2)).astype(dtype)
    dy_shape = (3,) * axis + idx_shape + (2,)
    dy = (rng.normal(size=dy_shape) * 10.0 ** rng.integers(-3, 3, dy_shape)).astype(dtype)
    _, (dx,) = grads(lambda t, i: ops.gather(t, i, axis), [x, idx], [dy])
    want = _gather_grad_ref(dy, idx, dim, axis, np.float32).astype(dtype)
    assert dx.dtype == dtype and dx.tobytes() == want.tobytes()


def test_float16_gather_and_slice():
    x = RNG.normal(size=(4, 3)).astype(np.float16)
    g, s = run_ops(lambda t, i: (ops.gather(t, i), ops.slice(t, 1, 3)), x,
                   np.array([3, 0], I32))
    assert g.dtype == s.dtype == np.float16
    np.testing.assert_array_equal(g, x[[3, 0]])
    np.testing.assert_array_equal(s, x[1:3])


def _build(fn):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3, 4), np.float32), name="x")
        res = fn(t)
        return ir, t, res, [op.type for op in ir.main_graph._data.ops]


def test_slice_all_none_returns_t_itself():
    ir, t, res, types = _build(lambda t: ops.slice(t))
    assert res is t and types == []
    ir, t, res, types = _build(lambda t: ops.slice_(t, axis=1))
    assert res is t and types == []


OP_TYPES = [
    (lambda t: ops.squeeze(ops.slice(t, 0, 1)), ["Slice", "Reshape"], "slice_out_squeezed"),
    (lambda t: ops.slice_(t, 0, 1), ["SliceInplace"], "slice_inplace_out"),
    (lambda t: ops.subsample(t, 2), ["Subsample"], "subsample_out"),
    (lambda t: ops.split(t, 3, 1)[2], ["Split"], "x_split_2"),
    (lambda t: ops.concat([t, t]), ["Concat"], "concat_out"),
    (lambda t: ops.concat_([t, t]), ["ConcatInplace"], "concat_inplace_out"),
    (lambda t: ops.gather(t, _const(np.int32(1))), ["Gather"], "gather_out"),
    (lambda t: ops.tied_gather(t, _const(np.int32(1))), ["TiedGather"], "tied_gather_out"),
    (lambda t: ops.dynamic_update_(t, _const(np.uint32([0])), t, [0], [2], False),
     ["DynamicUpdateInplace"], "dynamic_update_inplace_out"),
]


@pytest.mark.parametrize("fn,types,name", OP_TYPES, ids=[o[2] for o in OP_TYPES])
def test_op_types_and_output_names(fn, types, name):
    _, _, res, got = _build(fn)
    assert got == types and res.name == name


def test_dynamic_update_inplace_writes_into_variable():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((3, 2), np.float32), name="v")
        upd = popxl.constant(np.ones((1, 2), np.float32))
        ops.dynamic_update_(v, popxl.constant(np.uint32([1])), upd, [0], [1], False)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        got = sess.get_tensor_data(v)
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [0, 0]])


def test_dynamic_update_inplace_is_refused_by_autodiff():
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(t, i, u):
            return ops.dynamic_update_(t, i, u, [0], [1], False)
        g = ir.create_graph(fn, popxl.TensorSpec((3, 2), popxl.float32),
                            popxl.TensorSpec((1,), popxl.uint32),
                            popxl.TensorSpec((1, 2), popxl.float32))
        with pytest.raises(RuntimeError, match="modifying op"):
            popxl.transforms.autodiff(g)


ERRORS = [
    (lambda t: ops.squeeze(t, 1), ValueError,
     r"^Can't squeeze axis '1' as length of axis is >1: 3 \('x'"),
    (lambda t: ops.squeeze(t, [0, -2]), ValueError, r"^Axes contains duplicates"),
    (lambda t: ops.squeeze(t, [5]), ValueError, r"^Can't squeeze axis '5' as tensor has rank '2'"),
    (lambda t: ops.slice(t, [0, 1], [1]), ValueError,
     r"^All inputs must have same length. `stop` has length 1 != 2. \(slice:"),
    (lambda t: ops.slice(t, 0, 1, 0), ValueError, "slice: step must not be 0"),
    (lambda t: ops.slice(t, 0, 1, axis=3), ValueError, "slice: axis 3 is out of range"),
    (lambda t: ops.slice(t, 0.5), TypeError, "slice: start must be ints"),
    (lambda t: ops.subsample(t, [1, 0]), ValueError, "subsample: strides must be >= 1"),
    (lambda t: ops.subsample(t, [1, 1, 1, 1]), ValueError,
     r"^The length of subsample `strides` must not be greater than the rank of the input "
     r"tensor\. \(4 strides"),
    (lambda t: ops.split(t, 2, 1), ValueError,
     r"^Split 2 does not equally divide tensor axis 1 of length 3\."),
    (lambda t: ops.split(t, [1, 1], 1), ValueError, r"split: sizes \[1, 1\] must be >= 0 and "
                                                    r"sum to 3"),
    (lambda t: ops.concat([t, ops.cast(t, popxl.float16)]), TypeError,
     r"^All inputs to a concat operation must have the same type: "
     r"\[popxl.dtypes.float32, popxl.dtypes.float16\] \(concat"),
    (lambda t: ops.concat([t, ops.slice(t, 0, 1, axis=1)], 0), ValueError,
     "concat: shapes must match except on axis 0"),
    (lambda t: ops.concat(t), TypeError, "concat: 'ts' must be a list"),
    (lambda t: ops.gather(t, _const(np.float32([0]))), TypeError,
     "gather: 'indices' .* must be an integer tensor, got float32"),
    (lambda t: ops.groupedgather(t, _const(np.int32([[0]] * 2)), 0, 2), ValueError,
     "axis 0 is the group axis"),
    (lambda t: ops.scatter(t, _const(np.int32([0])), _const(np.float32([0]))), ValueError,
     "scatter: 'indices'"),
    (lambda t: ops.scatter_reduce(t, _const(np.int32([0, 1])), "sum"), ValueError,
     "^One of initial_values and axis_size must be specified"),
    (lambda t: ops.scatter_reduce(t, _const(np.int32([0, 1])), "mean", axis_size=2), ValueError,
     r"^The reduction must be one of \['sum', "),
    (lambda t: ops.scatter_reduce(t, _const(np.int32([0, 1, 0])), "sum", axis_size=2),
     ValueError, "scatter_reduce: 'indices' .* must have the shape of 'data'"),
    (lambda t: ops.dynamic_slice(t, _const(np.uint32([0, 0])), [0], [1], False), ValueError,
     r"dynamic_slice: 'index' .* must have shape \(1,\)"),
    (lambda t: ops.dynamic_slice(t, _const(np.uint32([0])), [1], [4], False), ValueError,
     r"size 4 for axis 1 .* must be in \[1, 3\]"),
    (lambda t: ops.onehot(_const(np.int32([0])), ops.cast(t, popxl.int32),
                          _const(np.float32([0, 1])), 0), ValueError,
     "num_classes' .* must be a popxl.constant"),
    (lambda t: ops.onehot(_const(np.int32([0])), _const(np.int32([3, 2])),
                          _const(np.float32([0, 1])), 0), ValueError, "must be a scalar"),
    (lambda t: ops.onehot(_const(np.int32([0])), _const(3), _const(np.float32([0, 1, 2])), 0),
     ValueError, r"'values' .* must have shape \(2,\)"),
]


@pytest.mark.parametrize("fn,exc,match", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_builder_errors(fn, exc, match):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((2, 3), np.float32), name="x")
        with pytest.raises(exc, match=match):
            fn(t)


@pytest.mark.parametrize("inplace", [True, False])
def test_slice_view_semantics_under_inplace_write(inplace):
    """A write into slice_(v) reaches v; a write into slice(v) does not."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((4, 2), np.float32), name="v")
        part = (ops.slice_ if inplace else ops.slice)(v, 1, 3)
        ops.dynamic_update_(part, popxl.constant(np.uint32([1])),
                            popxl.constant(np.ones((1, 2), np.float32)), [0], [1], False)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        got = sess.get_tensor_data(v)
    want = np.zeros((4, 2), np.float32)
    if inplace:
        want[2] = 1
    np.testing.assert_array_equal(got, want)


def test_diag_uses_slice_and_subsample():
    x = RNG.normal(size=(3, 3)).astype(np.float32)
    out, = run_ops(lambda t: t.diag(), x)
    np.testing.assert_array_equal(out, np.diag(x))


# --- out-of-range gather indices ----------------------------------------------------------
def _ref_gather_oor(x, idx, axis, zero_oor):
    dim = x.shape[axis]
    ok = (idx >= (0 if zero_oor else -dim)) & (idx < dim)
    taken = np.take(x, np.where(ok, idx, 0), axis)
    mask = ok.reshape((1,) * axis + ok.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, taken, 0).astype(x.dtype)


@pytest.mark.parametrize("op", ["gather", "tied_gather"])
@pytest.mark.parametrize("zero_oor", [False, True])
def test_gather_out_of_range_gives_zeros_not_an_error(op, zero_oor):
    """Upstream: undefined values (zeros with zero_OOR); here zeros, never a NumPy IndexError.
    Negative indices in [-dim, 0) count from the end unless zero_OOR."""
    idx = np.array([[0, 9], [-2, -7]], I32)
    fn = getattr(ops, op)
    out, = run_ops(lambda t, i: fn(t, i, 1, zero_OOR=zero_oor), X, idx)
    np.testing.assert_array_equal(out, _ref_gather_oor(X, idx, 1, zero_oor))
    assert (out[:, 0, 1] == 0).all() and (out[:, 1, 1] == 0).all()     # 9 and -7: out of range


def test_grouped_gather_out_of_range_and_gradient_drops_it():
    idx = np.array([[0, 4], [5, 1], [2, -9]], I32)
    out, = run_ops(lambda t, i: ops.groupedgather(t, i, 1, group_size=3), X, idx)
    ref = np.stack([_ref_gather_oor(X[g], idx[g], 0, False) for g in range(3)])
    np.testing.assert_array_equal(out, ref)
    x = X[0]
    gidx = np.array([1, 7, 1, -1], I32)                  # 7 is out of range
    dy = RNG.normal(size=(4, 5)).astype(np.float32)
    _, (dx,) = grads(lambda t, i: ops.gather(t, i), [x, gidx], [dy])
    want = np.zeros_like(x, dtype=np.float64)
    np.add.at(want, gidx[[0, 2, 3]], dy[[0, 2, 3]])
    np.testing.assert_allclose(dx, want, rtol=1e-6)


# --- grouped_scatter_reduce -----------------------------------------------------------------
def grouped_ref(data, idx, red, size, init=None):
    g, _, rest = data.shape[0], data.shape[1], data.shape[2:]
    out = np.zeros((g, size) + rest) if init is None else init.copy()
    for gi in range(g):
        for k in range(size):
            sel = data[gi][idx[gi] == k]
            if not len(sel):
                continue
            if red == "none":
                out[gi, k] = sel[-1]
            elif init is None:
                out[gi, k] = {"sum": sel.sum(0), "max": sel.max(0), "min": sel.min(0)}[red]
            else:
                f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[red]
                out[gi, k] = f.reduce(np.concatenate([out[gi, k][None], sel]), axis=0)
    return out


@pytest.mark.parametrize("red", ["sum", "max", "min", "none"])
@pytest.mark.parametrize("with_init", [False, True])
def test_grouped_scatter_reduce_matches_per_group_loop(red, with_init):
    rng = np.random.default_rng(8)
    data = rng.normal(size=(3, 6, 2))
    idx = rng.integers(0, 4, size=(3, 6)).astype(np.int32)      # one index list per group
    init = rng.normal(size=(3, 4, 2)) if with_init else None
    arrays = [data, idx] + ([init] if with_init else [])
    y, = run_ops(lambda d, i, *v: ops.grouped_scatter_reduce(
        d, i, red, v[0] if v else None, axis=1, axis_size=4, group_size=3), *arrays)
    np.testing.assert_allclose(y, grouped_ref(data, idx, red, 4, init), rtol=1e-12)


def test_grouped_scatter_reduce_full_indices_and_grads():
    rng = np.random.default_rng(9)
    data = rng.normal(size=(2, 5, 3))
    idx = rng.integers(0, 3, size=(2, 5, 3)).astype(np.int32)
    fn = lambda d, i: ops.grouped_scatter_reduce(d, i, "sum", axis=1,  # noqa: E731
                                                 axis_size=3, group_size=2)
    y, = run_ops(fn, data, idx)
    want = np.zeros((2, 3, 3))
    for g, j, c in np.ndindex(*data.shape):
        want[g, idx[g, j, c], c] += data[g, j, c]
    np.testing.assert_allclose(y, want, rtol=1e-12)
    dy = rng.normal(size=(2, 3, 3))
    _, (got,) = grads(fn, [data, idx], [dy])
    np.testing.assert_allclose(got, numeric_grads(fn, [data, idx], [dy])[0], rtol=1e-6)


@pytest.mark.parametrize("build,err,match", [
    (lambda x, w, i: ops.grouped_scatter_reduce(x, i, "sum", axis=0, axis_size=2,
                                                group_size=2), ValueError, "group dim 0"),
    (lambda x, w, i: ops.grouped_scatter_reduce(x, i, "sum", axis=1, axis_size=2,
                                                group_size=3), ValueError, "leading group"),
])
def test_grouped_scatter_reduce_builder_errors(build, err, match):
    check_image_builder_error(build, err, match)


# --- reshape / flatten / transpose (views) -----------------------------------------------------
VIEWS = [
    ("reshape", lambda a: a.reshape((3, -1)), lambda a: a.reshape(3, -1), [(2, 3)]),
    ("flatten", ops.flatten, lambda a: a.reshape(-1), [(2, 3)]),
    ("transpose", lambda a: a.transpose((1, 2, 0)), lambda a: a.transpose(1, 2, 0), [(2, 3, 4)]),
    ("T", lambda a: a.T, lambda a: a.T, [(2, 3)]),
]
POSITIVE: dict = {}


@pytest.mark.parametrize("name,fn,ref,shapes", VIEWS, ids=[r[0] for r in VIEWS])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_views_forward_matches_numpy(name, fn, ref, shapes, dtype):
    check_forward(fn, ref, shapes, dtype, positive=POSITIVE.get(name, ()))


@pytest.mark.parametrize("name,fn,ref,shapes", VIEWS, ids=[r[0] for r in VIEWS])
def test_views_gradients_match_finite_differences(name, fn, ref, shapes):
    check_grads(fn, ref, shapes, positive=POSITIVE.get(name, ()))


def test_concat_and_split_shape_errors_are_popart_setup_errors():
    """As upstream (the ops' C++ setup): popart_exception, also ValueError."""
    import popart

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros((2, 4), np.float32), name="a")
        b = popxl.variable(np.zeros((3,), np.float32), name="b")
        t = popxl.variable(np.zeros((5, 2), np.float32), name="t")
        with pytest.raises(popart.popart_exception, match="shapes must match except on axis 0"):
            ops.concat((a, b))
        with pytest.raises(popart.popart_exception, match=r"sizes \[1, 2\] must be >= 0 and sum"):
            ops.split(t, [1, 2])
        with pytest.raises(ValueError):
            ops.split(t, [1, 2])


def test_ipu_none_leaves_ops_unplaced_as_upstream():
    from popxl.errors import UndefinedValue

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.float32(1), name="a")
        with popxl.ipu(None):
            b = a + 1.0
        with pytest.raises(UndefinedValue):
            b.ipu
        with pytest.raises(ValueError, match="^Could not infer the ipu for Tensor to be copied"):
            ops.ipu_copy(b, 1)
        with pytest.raises(ValueError, match="non-negative int or None"):
            with popxl.ipu(-1):
                pass


@pytest.mark.parametrize("inplace", [False, True])
def test_dynamic_update_of_another_shape_builds_and_the_session_refuses_it(inplace):
    """As upstream, dynamic_update(_) builds with a t_update not of the window's shape; the
    Session refuses it, naming the op and the window shape."""
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((3, 5, 7), np.float32), name="t")
        idx = popxl.variable(np.array([1, 2], np.uint32), name="idx")
        u = popxl.variable(np.ones((1, 3), np.float32), name="u")
        fn = ops.dynamic_update_ if inplace else ops.dynamic_update
        out = fn(t, idx, u, [0, 2], [1, 3], True)
    assert out.shape == (3, 5, 7)
    with pytest.raises(ValueError, match=r"^Session: DynamicUpdate(Inplace)?\.\d+ .*'t_update' "
                                         r"'u' has shape \(1, 3\), expected the window shape "
                                         r"\(1, 5, 3\) \(the op builds, as upstream, but "
                                         r"cannot compile\)$"):
        popxl.Session(ir, "cpu")
