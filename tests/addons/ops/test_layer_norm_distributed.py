"""`layer_norm_distributed` and the `LayerNormDistributed` layer against the layer norm of the
unsplit hidden axis (forward and gradients, in NumPy: tests/references.py), and
`grad_reduce_square_add`."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
import references as ref
from harness import grads, replicated_grads, run_ops
from popxl_addons.layers.layer_norm_distributed import LayerNormDistributed
from popxl_addons.ops.grad_reduce_square_add import grad_reduce_square_add
from popxl_addons.ops.layer_norm_distributed import layer_norm_distributed

N, H = 5, 3


@pytest.mark.parametrize("R,tp", [(1, 1), (2, 2), (4, 4), (4, 2)])
def test_against_reference(R, tp):
    rng = np.random.default_rng(R * 7 + tp)
    dp = R // tp
    x = (rng.normal(size=(dp, 2, N, H * tp)) * 2 + 0.5).astype(np.float32)
    w = rng.normal(size=(H * tp,)).astype(np.float32)
    b = rng.normal(size=(H * tp,)).astype(np.float32)
    dy = rng.normal(size=(dp, 2, N, H * tp)).astype(np.float32)
    own = lambda a, r: a[..., (r % tp) * H:(r % tp + 1) * H]  # noqa: E731
    xs = np.stack([own(x[r // tp], r) for r in range(R)])
    ws = np.stack([own(w, r) for r in range(R)])
    bs = np.stack([own(b, r) for r in range(R)])
    dys = np.stack([own(dy[r // tp], r) for r in range(R)])

    def fn(xt, wt, bt):
        return layer_norm_distributed(xt, wt, bt, group=xt.ir.replica_grouping(group_size=tp))

    (y,), (dx, dw, db) = replicated_grads(fn, R, [xs, ws, bs], [dys])
    for r in range(R):
        ty, tdx, tdw, tdb = ref.layer_norm(x[r // tp], w.astype(np.float64),
                                           b.astype(np.float64), dy[r // tp], eps=1e-5)
        np.testing.assert_allclose(y[r], own(ty, r), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dx[r], own(tdx, r), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dw[r], own(tdw, r), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(db[r], own(tdb, r), rtol=1e-4, atol=1e-5)


def test_float16():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, N, H)).astype(np.float16)
    w = np.ones((2, H), np.float16)
    b = np.zeros((2, H), np.float16)
    (y,), _ = replicated_grads(lambda a, c, d: layer_norm_distributed(a, c, d), 2, [x, w, b],
                               [np.ones_like(x)])
    full = np.concatenate([x[0], x[1]], axis=-1).astype(np.float64)
    want = (full - full.mean(1, keepdims=True)) / np.sqrt(full.var(1, keepdims=True) + 1e-5)
    assert y.dtype == np.float16
    np.testing.assert_allclose(np.concatenate([y[0], y[1]], axis=-1), want, atol=3e-3)


def test_layer_holds_one_shard_per_group_member():
    """TP=2 x DP=2: weight and bias use the transposed grouping: two values, one per tensor-
    parallel position, shared by the data-parallel copies."""
    ir = popxl.Ir(replication=4)
    tp = ir.replica_grouping(group_size=2)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, N, H)).astype(np.float32)
    w = rng.normal(size=(2, H)).astype(np.float32)
    with ir.main_graph:
        s = popxl.h2d_stream((N, H), popxl.float32, "x")
        facts, graph = LayerNormDistributed(tp).create_graph(s.spec)
        assert facts.weight.replica_grouping == tp.transpose()
        variables = facts.init()
        y = graph.bind(variables).call(ops.host_load(s))[0]
        out = addons.host_store(y)
    with popxl.Session(ir, "ipu_hw") as sess:
        assert sess.get_tensor_data(variables.weight).shape == (2, H)
        sess.write_variable_data(variables.weight, w)
        got = sess.run({s: x})[out]
    for d in range(2):
        full = np.concatenate([x[2 * d], x[2 * d + 1]], axis=-1)
        norm = (full - full.mean(1, keepdims=True)) / np.sqrt(full.var(1, keepdims=True) + 1e-5)
        want = norm * np.concatenate([w[0], w[1]])
        np.testing.assert_allclose(np.concatenate([got[2 * d], got[2 * d + 1]], -1), want,
                                   rtol=1e-5, atol=1e-5)


def test_layer_norm_errors():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((N, H), np.float32), name="x")
        w = popxl.variable(np.zeros((H,), np.float32), name="w")
        with pytest.raises(ValueError, match=r"must have shape \(3,\)"):
            layer_norm_distributed(x, ops.reshape(x, (N * H,)), w)
        with pytest.raises(ValueError, match="dtype float32"):
            layer_norm_distributed(x, ops.cast(w, popxl.float16), w)
        with pytest.raises(TypeError, match="float32 or float16"):
            layer_norm_distributed(ops.cast(x, popxl.int32), w, w)
        with pytest.raises(ValueError, match="epsilon"):
            layer_norm_distributed(x, w, w, epsilon=-1.0)


# --- grad_reduce_square_add --------------------------------------------------------------------
def test_grad_reduce_square_add_float32_and_tensor_loss_scaling():
    rng = np.random.default_rng(3)
    g = rng.normal(size=(4, 6)).astype(np.float32) * 128
    out, = run_ops(lambda t: grad_reduce_square_add(t, 128.0), g)
    assert out.dtype == np.float32 and out.shape == ()
    np.testing.assert_allclose(out, np.sum((g.astype(np.float64) / 128) ** 2), rtol=1e-6)
    out, = run_ops(lambda t, s: grad_reduce_square_add(t, s), g, np.array(64.0, np.float32))
    np.testing.assert_allclose(out, np.sum((g.astype(np.float64) / 64) ** 2), rtol=1e-6)


def test_grad_reduce_square_add_float16_does_not_overflow():
    g = np.full((300,), 30000.0, np.float16)          # g**2 overflows float16 and 300*g**2 too
    out, = run_ops(lambda t: grad_reduce_square_add(t, 32768.0), g)
    np.testing.assert_allclose(out, 300 * (30000.0 / 32768.0) ** 2, rtol=1e-3)


def test_grad_reduce_square_add_has_no_gradient():
    x = np.ones((3,), np.float32)
    with pytest.raises(RuntimeError, match="Unable to provide required gradient"):
        grads(lambda t: grad_reduce_square_add(t, 1.0), [x], [np.float32(1.0)])
    # it does not stop the gradients of other uses of its input
    _, (dx,) = grads(lambda t: (t * 2.0, grad_reduce_square_add(t, 1.0)), [x],
                     [np.ones(3, np.float32), np.float32(1.0)])
    np.testing.assert_array_equal(dx, np.full(3, 2.0))


def test_grad_reduce_square_add_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((3,), np.float32), name="x")
        with pytest.raises(ValueError, match="must not be 0"):
            grad_reduce_square_add(x, 0)
        with pytest.raises(TypeError, match="loss_scaling"):
            grad_reduce_square_add(x, "1")
        with pytest.raises(ValueError, match="float scalar"):
            grad_reduce_square_add(x, x)
        with pytest.raises(TypeError, match="float tensor"):
            grad_reduce_square_add(ops.cast(x, popxl.int32), 1.0)
