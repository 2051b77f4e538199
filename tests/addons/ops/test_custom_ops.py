"""The single-replica custom ops: `rotary_pos_embed` (+ tables), group quantisation and
`LinearGQ`, `linear_layout`, and the dense x constant-sparse matmul, against NumPy references
written here (gradients against finite differences or the matmul identity)."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
import references as ref
from harness import grads, run_ops
from popxl_addons.layers.linear_gq import LinearGQ
from popxl_addons.ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress,
    group_quantize_decompress_numpy,
)
from popxl_addons.ops.linear_layout import linear_layout
from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed, trig_table_constants, trig_tables
from popxl_addons.ops.static_sparse_ops import (
    CSRMatrix,
    dense_const_sparse_matmul,
    random_sparse,
)


# --- rotary positional embedding ----------------------------------------------------------------
def _rope_ref(x, sin, cos, rotary_dim, inverse=False):
    """x (batch, seq, heads, head_dim); sin/cos broadcastable to (batch, seq, rotary_dim // 2).
    Element by element in float64: pair i of position (b, p) is (x[2i], x[2i + 1]), turned by the
    angle whose sine and cosine are the tables' (b, p, i); `inverse` turns it back."""
    x64 = x.astype(np.float64)
    out = x64.copy()
    batch, seq, heads, _ = x.shape
    s = np.broadcast_to(np.asarray(sin, np.float64), (batch, seq, rotary_dim // 2))
    c = np.broadcast_to(np.asarray(cos, np.float64), (batch, seq, rotary_dim // 2))
    for b, p, h, i in np.ndindex(batch, seq, heads, rotary_dim // 2):
        re, im = x64[b, p, h, 2 * i], x64[b, p, h, 2 * i + 1]
        sn = -s[b, p, i] if inverse else s[b, p, i]
        out[b, p, h, 2 * i] = re * c[b, p, i] - im * sn
        out[b, p, h, 2 * i + 1] = im * c[b, p, i] + re * sn
    return out


def test_trig_tables():
    sin, cos = trig_tables(5, 6, base=100)
    assert sin.shape == cos.shape == (5, 3) and sin.dtype == np.float32
    np.testing.assert_allclose(sin[4, 1], np.sin(4 / 100 ** (2 / 6)), rtol=1e-6)
    np.testing.assert_allclose(cos[3, 2], np.cos(3 / 100 ** (4 / 6)), rtol=1e-6)
    # the arithmetic is done in the tables' dtype, as upstream
    sin16, cos16 = trig_tables(6, 4, np_dtype="float16")
    assert sin16.dtype == cos16.dtype == np.float16
    angle16 = np.outer(np.arange(6).astype(np.float16),
                       np.float16(10000) ** (-np.arange(0, 4, 2).astype(np.float16) / 4))
    assert angle16.dtype == np.float16
    np.testing.assert_array_equal(sin16, np.sin(angle16))


def _rope_tables(shape, rotary_dim, seed):
    """Arbitrary angles (not just position-based ones) in a table of `shape`."""
    angle = np.random.default_rng(seed).uniform(-3, 3, size=shape[:-1] + (rotary_dim // 2,))
    return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


@pytest.mark.parametrize("table_shape, rotary_dim", [
    ((5, None), 8),        # (seq, rotary_dim // 2): made (1, seq, ...)
    ((1, 5, None), 8),
    ((2, 5, None), 8),     # one table per batch element
    ((5, None), 4),        # rotary_dim < head_dim: the other features pass through
    ((2, 5, None), 6),
])
def test_rotary_pos_embed_forward_and_gradient(table_shape, rotary_dim):
    rng = np.random.default_rng(rotary_dim)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)      # (batch, seq, heads, head_dim)
    shape = table_shape[:-1] + (rotary_dim // 2,)
    sin, cos = _rope_tables(shape, rotary_dim, seed=len(shape))

    def fn(t):
        return rotary_pos_embed(t, popxl.constant(sin), popxl.constant(cos), rotary_dim)

    out, = run_ops(fn, x)
    want = _rope_ref(x, sin, cos, rotary_dim)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[..., rotary_dim:], x[..., rotary_dim:])
    dy = rng.normal(size=x.shape).astype(np.float32)
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, _rope_ref(dy, sin, cos, rotary_dim, inverse=True),
                               rtol=1e-5, atol=1e-6)
    # the gradient is the transpose of the forward map: <rope(x), dy> == <x, dx>
    np.testing.assert_allclose(np.sum(want * dy), np.sum(x.astype(np.float64) * dx), rtol=1e-5)


def test_rotary_pos_embed_position_tables_and_default_rotary_dim():
    """trig_table_constants' tables; rotary_dim None rotates the whole head."""
    x = np.random.default_rng(1).normal(size=(1, 6, 2, 4)).astype(np.float32)
    out, = run_ops(lambda t: rotary_pos_embed(t, *trig_table_constants(6, 4, base=50)), x)
    angle = np.outer(np.arange(6), 50.0 ** (-np.arange(0, 4, 2) / 4))
    np.testing.assert_allclose(out, _rope_ref(x, np.sin(angle), np.cos(angle), 4), rtol=1e-5,
                               atol=1e-6)
    # position 0 is not turned; pair 0 of position 1 is turned by exactly 1 radian
    np.testing.assert_array_equal(out[:, 0], x[:, 0])
    z = (x[0, 1, :, 0] + 1j * x[0, 1, :, 1]) * np.exp(1j)
    np.testing.assert_allclose(out[0, 1, :, 0] + 1j * out[0, 1, :, 1], z, rtol=1e-5)


def test_rotary_pos_embed_float16():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 2, 6)).astype(np.float16)
    sin, cos = (a.astype(np.float16) for a in _rope_tables((2, 4, 2), 4, seed=3))

    def fn(t):
        return rotary_pos_embed(t, popxl.constant(sin), popxl.constant(cos), 4)

    out, = run_ops(fn, x)
    assert out.dtype == np.float16
    # computed in float32 and rounded once
    np.testing.assert_array_equal(out, _rope_ref(x, sin, cos, 4).astype(np.float32)
                                  .astype(np.float16))
    dy = rng.normal(size=x.shape).astype(np.float16)
    _, (dx,) = grads(fn, [x], [dy])
    assert dx.dtype == np.float16
    np.testing.assert_allclose(dx, _rope_ref(dy, sin, cos, 4, inverse=True), atol=4e-3)


def test_rotary_pos_embed_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 4, 1, 6), np.float32))
        sin, cos = trig_table_constants(4, 6)
        with pytest.raises(ValueError, match="rotary_dim must be an even int"):
            rotary_pos_embed(t, sin, cos, 8)
        with pytest.raises(ValueError, match="rotary_dim must be an even int"):
            rotary_pos_embed(t, sin, cos, 3)
        with pytest.raises(ValueError, match=r"does not broadcast to .* = \(2, 4, 2\)"):
            rotary_pos_embed(t, sin, cos, 4)
        with pytest.raises(ValueError, match=r"does not broadcast to .* = \(2, 4, 3\)"):
            rotary_pos_embed(t, *trig_table_constants(5, 6))
        with pytest.raises(ValueError, match="must have rank 3"):
            rotary_pos_embed(t, sin, ops.reshape(cos, (12,)))
        with pytest.raises(ValueError, match=r"rank 4 \(batch, seq, heads, head_dim\)"):
            rotary_pos_embed(ops.reshape(t, (8, 6)), sin, cos)
        with pytest.raises(TypeError, match="dtype of"):
            rotary_pos_embed(t, *trig_table_constants(4, 6, dtype=popxl.float16))


# --- group quantisation -----------------------------------------------------------------------
def _decompress_ref(packed, scale, bias, dim):
    """Element by element: value j of group g is nibble j % 4 of word j // 4, counted from the
    highest nibble (upstream's packing: `codes @ [4096, 256, 16, 1]`)."""
    lead = packed.shape[:-2]
    G, W = packed.shape[-2:]
    out = np.zeros(lead + (G * W * 4,), np.float32)
    for idx in np.ndindex(lead + (G, W * 4)):
        *rest, g, j = idx
        code = (int(packed[(*rest, g, j // 4)]) >> (4 * (3 - j % 4))) & 15
        out[(*rest, g * W * 4 + j)] = code * np.float32(scale[(*rest, g, 0)]) + np.float32(
            bias[(*rest, g, 0)])
    return np.moveaxis(out.astype(scale.dtype), -1, dim)


@pytest.mark.parametrize("dim,group", [(-1, 8), (0, 4), (1, 16)])
def test_group_quantize_round_trip_and_kernel(dim, group):
    rng = np.random.default_rng(group)
    w = rng.normal(size=(8, 16)).astype(np.float32)
    packed, scale, bias = group_quantize_compress_numpy(w, group, dim)
    moved = np.moveaxis(w, dim, -1)
    assert packed.dtype == np.uint16 and scale.dtype == bias.dtype == np.float16
    assert packed.shape == moved.shape[:-1] + (moved.shape[-1] // group, group // 4)
    assert scale.shape == moved.shape[:-1] + (moved.shape[-1] // group, 1)
    host = group_quantize_decompress_numpy(packed, scale, bias, dim)
    ref = _decompress_ref(packed, scale, bias, dim)
    np.testing.assert_array_equal(host, ref)
    step = np.repeat(scale.astype(np.float32), group, axis=-1).reshape(moved.shape)
    assert np.all(np.abs(np.moveaxis(host, dim, -1) - moved) <= step / 2 + 2e-3)
    out, = run_ops(lambda t, s, b: group_quantize_decompress(t, s, b, dim), packed, scale, bias)
    assert out.dtype == np.float16 and out.shape == w.shape
    np.testing.assert_array_equal(out, ref)


def test_group_quantize_packs_as_upstream_and_refuses_non_finite_data():
    """upstream's layout: the four codes of a word, first in the highest nibble."""
    codes = np.array([[1, 2, 3, 4, 5, 6, 7, 8]], np.uint16)
    w = codes.astype(np.float32)                    # scale 7/15 ... values as codes with
    w[0, 0], w[0, -1] = 0.0, 15.0                   # min 0, max 15: scale 1, bias 0
    packed, scale, bias = group_quantize_compress_numpy(w, 8, -1)
    assert scale[0, 0, 0] == 1 and bias[0, 0, 0] == 0
    want = (np.array([0, 2, 3, 4, 5, 6, 7, 15]).reshape(2, 4)
            @ np.array([4096, 256, 16, 1])).astype(np.uint16)
    np.testing.assert_array_equal(packed[0, 0], want)
    bad = w.copy()
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match="^Cannot compress t which contains non-finite values"):
        group_quantize_compress_numpy(bad, 8, -1)


def test_group_quantize_constant_groups_and_errors():
    packed, scale, bias = group_quantize_compress_numpy(np.full((2, 4), 3.0), 4, -1)
    assert np.all(scale == 0) and np.all(group_quantize_decompress_numpy(
        packed, scale, bias, -1) == 3.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        group_quantize_compress_numpy(np.zeros((2, 12)), 6, -1)
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        group_quantize_compress_numpy(np.zeros((2, 12)), 4, 2)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3, 1), np.uint16))
        s = popxl.variable(np.zeros((2, 3, 1), np.float16))
        with pytest.raises(TypeError, match="must be uint16"):
            group_quantize_decompress(ops.cast(t, popxl.int32), s, s)
        with pytest.raises(ValueError, match=r"shape \(2, 3, 1\)"):
            group_quantize_decompress(t, ops.reshape(s, (6, 1)), s)
        with pytest.raises(ValueError, match="dim 2 is out of range"):
            group_quantize_decompress(t, s, s, dim=2)


def test_linear_gq_forward_gradient_and_torch_mapping():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 16)).astype(np.float16)
    # a torch.nn.Linear(16, 8): weight (out, in), bias, both U(-1/4, 1/4) as torch initialises
    layer = ref.TorchLikeLayer(weight=rng.uniform(-0.25, 0.25, (8, 16)).astype(np.float32),
                               bias=rng.uniform(-0.25, 0.25, (8,)).astype(np.float32))
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream(x.shape, popxl.float16, "x")
        facts, graph = LinearGQ(8, group_size=8).create_graph(s.spec)
        variables = facts.init()
        xt = ops.host_load(s)
        info = graph.bind(variables).call_with_info(xt)
        dgraph = addons.autodiff(graph, grads_required=graph.graph.inputs[:1])
        dx, = dgraph.call(popxl.constant(np.ones((3, 8), np.float16)),
                          args=dgraph.grad_graph_info.inputs_dict(info))
        outs = [addons.host_store(t) for t in (info.outputs[0], dx)]
    assert variables.weight.dtype == popxl.uint16 and variables.weight.shape == (16, 1, 2)
    weights = LinearGQ.torch_mapping(variables, layer, popxl.float16, group_size=8)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.write_variables_data(weights)
        y, gx = (sess.run({s: x})[o] for o in outs)
    w = group_quantize_decompress_numpy(weights[variables.weight],
                                        weights[variables.weight_scale],
                                        weights[variables.weight_bias], -1).astype(np.float32)
    want = x.astype(np.float32) @ w + layer.bias.numpy()
    np.testing.assert_allclose(y, want, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y, x.astype(np.float32) @ layer.weight.numpy().T
                               + layer.bias.numpy(), atol=0.1)   # quantisation error
    np.testing.assert_allclose(gx, np.ones((3, 8)) @ w.T, rtol=2e-2, atol=2e-2)


def test_linear_gq_initial_weights_are_one_quantised_draw():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = LinearGQ(8, dim=0).create_graph(popxl.TensorSpec((2, 12), popxl.float32))
        v = facts.init()
    with popxl.Session(ir, "ipu_hw") as sess:
        data = sess.get_tensors_data([v.weight, v.weight_scale, v.weight_bias])
    w = group_quantize_decompress_numpy(data[v.weight], data[v.weight_scale],
                                        data[v.weight_bias], 0)
    assert w.shape == (12, 8) and 0.005 < w.std() < 0.05     # truncated normal, std 0.02


# --- linear layout and static sparse matmul ---------------------------------------------------
def test_linear_layout_is_an_identity_with_identity_gradient():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    out, = run_ops(lambda t: linear_layout(t, bs=4), x)
    np.testing.assert_array_equal(out, x)
    dy = np.full((3, 4), 2.0, np.float32)
    _, (dx,) = grads(lambda t: linear_layout(t) * 3.0, [x], [dy])
    np.testing.assert_array_equal(dx, 6.0)
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="bs must be a positive int"):
        linear_layout(popxl.variable(x), bs=0)


def test_csr_matrix_and_random_sparse():
    rng = np.random.default_rng(1)
    dense = rng.normal(size=(6, 7))
    m = CSRMatrix.from_dense(np.where(dense > 0, dense, 0))
    np.testing.assert_array_equal(m.toarray(), np.where(dense > 0, dense, 0))
    np.random.seed(0)
    big = random_sparse(np.ones((100, 100), np.float32), density=0.3)
    assert 0.25 < big.nnz / 10000 < 0.35 and np.all(big.data == 1)
    with pytest.raises(ValueError, match="not a valid CSR"):
        CSRMatrix(np.ones(2), [0, 9], [0, 1, 2], (2, 3))
    with pytest.raises(ValueError, match="density"):
        random_sparse(dense, 1.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dense_const_sparse_matmul_forward_and_gradient(dtype):
    rng = np.random.default_rng(2)
    lhs = rng.normal(size=(2, 3, 6)).astype(dtype)
    dense = np.where(rng.random((6, 5)) < 0.4, rng.normal(size=(6, 5)), 0).astype(np.float32)
    rhs = CSRMatrix.from_dense(dense)
    out, = run_ops(lambda t: dense_const_sparse_matmul(t, rhs, 5), lhs)
    assert out.dtype == dtype and out.shape == (2, 3, 5)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(out, lhs.astype(np.float32) @ dense, rtol=tol, atol=tol)
    dy = rng.normal(size=(2, 3, 5)).astype(dtype)
    _, (dx,) = grads(lambda t: dense_const_sparse_matmul(t, rhs, 5), [lhs], [dy])
    np.testing.assert_allclose(dx, dy.astype(np.float32) @ dense.T, rtol=tol, atol=tol)


def test_dense_const_sparse_matmul_accepts_any_csr_object_and_checks():
    class ScipyLike:                          # the attributes of a scipy.sparse.csr_matrix
        data = np.array([2.0, 3.0])
        indices = np.array([1, 0])
        indptr = np.array([0, 1, 1, 2])
        shape = (3, 2)

    lhs = np.array([[1.0, 10.0, 100.0]], np.float32)
    out, = run_ops(lambda t: dense_const_sparse_matmul(t, ScipyLike(), 2), lhs)
    np.testing.assert_array_equal(out, [[300.0, 2.0]])
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(lhs)
        with pytest.raises(ValueError, match="output_cols"):
            dense_const_sparse_matmul(t, ScipyLike(), 3)
        with pytest.raises(ValueError, match="inner dims differ"):
            dense_const_sparse_matmul(ops.reshape(t, (3, 1)), ScipyLike(), 2)
        with pytest.raises(TypeError, match="CSR matrix"):
            dense_const_sparse_matmul(t, np.eye(3), 3)
