"""`popxl_addons.ops.replicated_all_reduce_TP` (and the strided identical variants): a Megatron
MLP split over replicas against the unsplit MLP's chain rule in NumPy, the OpToIdentity
requirement, and argument errors. Forward and gradients on 1, 2 and 4 replicas, on every
backend: tests/popxl_dist/runtime/tp_cases.py."""
from __future__ import annotations

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
import references as ref
from harness import replicated_grads
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce,
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.ops.replicated_strided_collectives import (
    replicated_all_reduce_strided,
    replicated_all_reduce_strided_identical_grad_inputs,
    replicated_all_reduce_strided_identical_inputs,
)
from popxl_addons.patterns import apply_pre_alias_patterns, patterns_level

MSG = "You need to run the `OpToIdentityPattern` pattern before running the IR."


@pytest.mark.parametrize("R,tp", [(2, 2), (4, 2), (4, 4)])
def test_megatron_mlp_matches_reference(R, tp):
    """y = gelu(x W1) W2 with W1 split by columns and W2 by rows over the tp replicas of each
    group: every member's y and dx equal the unsplit MLP's, and its weight gradients are the
    shards of the full ones."""
    rng = np.random.default_rng(R + tp)
    B, Hd, F = 3, 4, 8
    dp = R // tp
    x = rng.normal(size=(dp, B, Hd)).astype(np.float32)
    w1 = rng.normal(size=(Hd, F)).astype(np.float32)
    w2 = rng.normal(size=(F, Hd)).astype(np.float32)
    dy = rng.normal(size=(dp, B, Hd)).astype(np.float32)
    f = F // tp
    per = lambda a, d: np.stack([a(r // tp, r % tp) for r in range(R)])  # noqa: E731
    xs = per(lambda d, i: x[d], None)
    w1s = per(lambda d, i: w1[:, i * f:(i + 1) * f], None)
    w2s = per(lambda d, i: w2[i * f:(i + 1) * f], None)
    dys = per(lambda d, i: dy[d], None)

    def mlp(xt, a, b):
        group = xt.ir.replica_grouping(group_size=tp)
        xt = replicated_all_reduce_identical_inputs(xt, group=group)
        h = ops.gelu(xt @ a)
        return replicated_all_reduce_identical_grad_inputs(h @ b, group=group)

    (y,), (dx, dw1, dw2) = replicated_grads(mlp, R, [xs, w1s, w2s], [dys])
    W1, W2 = w1.astype(np.float64), w2.astype(np.float64)
    for d in range(dp):
        z = x[d].astype(np.float64) @ W1                  # y = gelu(x W1) W2, backwards:
        h = ref.gelu_tanh(z)
        want_y = h @ W2
        dz = (dy[d] @ W2.T) * ref.gelu_tanh(z, 1)
        want_dx, want_dw1, want_dw2 = dz @ W1.T, x[d].T @ dz, h.T @ dy[d]
        for i in range(tp):
            r = d * tp + i
            np.testing.assert_allclose(y[r], want_y, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(dx[r], want_dx, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(dw1[r], want_dw1[:, i * f:(i + 1) * f],
                                       rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(dw2[r], want_dw2[i * f:(i + 1) * f],
                                       rtol=1e-4, atol=1e-5)


def _program(fn, R=2):
    """An Ir whose main graph stores fn(x) and whose grad graph (addons.autodiff) is called."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        x = popxl.variable(np.arange(3, dtype=np.float32), name="x")
        g = ir.create_graph(fn, x.spec)
        return ir, g, x


def test_session_needs_the_pattern_for_identical_inputs_only():
    ir, g, x = _program(lambda t: replicated_all_reduce_identical_inputs(t))
    with ir.main_graph:
        addons.host_store(ops.call(g, x)[0])
    with pytest.raises(popxl.errors.popart_exception, match="OpToIdentityPattern"):
        popxl.Session(ir, "ipu_hw")        # popart's exception, as upstream (a RuntimeError)
    for level in ("no_patterns", "minimal"):
        apply_pre_alias_patterns(ir, level)
        with pytest.raises(RuntimeError, match=re.escape(MSG)):
            popxl.Session(ir, "ipu_hw")
    apply_pre_alias_patterns(ir, "default")
    assert [op.type for op in g._data.ops] == ["Identity"]
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()
    np.testing.assert_array_equal(list(out.values())[0], np.tile(np.arange(3.0), (2, 1)))
    # the other two run without the pattern
    for fn in (replicated_all_reduce_identical_grad_inputs, replicated_all_reduce):
        ir, g, x = _program(lambda t, fn=fn: fn(t))
        with ir.main_graph:
            addons.host_store(ops.call(g, x)[0])
        with popxl.Session(ir, "ipu_hw") as sess:
            got = list(sess.run().values())[0]
        np.testing.assert_array_equal(got, np.tile(2 * np.arange(3.0), (2, 1)))


def test_addons_autodiff_applies_the_pattern_to_gradient_graphs():
    fwd = lambda t: replicated_all_reduce_identical_grad_inputs(t * 2.0)  # noqa: E731
    ir, g, x = _program(fwd)
    plain = popxl.transforms.autodiff(g)
    grad_op = [op for op in plain.graph._data.ops if op.type == "ReplicatedAllReduceTP"]
    assert grad_op and grad_op[0].attrs["identical_inputs"]      # gradient: f, not yet identity
    with ir.main_graph:
        info = ops.call_with_info(g, x)
        addons.host_store(ops.call(plain.graph, popxl.constant(np.ones(3, np.float32)),
                                   inputs_dict=plain.inputs_dict(info))[0])
    with pytest.raises(RuntimeError, match="OpToIdentityPattern"):
        popxl.Session(ir, "ipu_hw")

    ir, g, x = _program(fwd)
    bwd = addons.autodiff(g)
    assert "ReplicatedAllReduceTP" not in [op.type for op in bwd.graph._data.ops]
    assert "Identity" in [op.type for op in bwd.graph._data.ops]
    with ir.main_graph:
        info = ops.call_with_info(g, x)
        d = addons.host_store(bwd.call(popxl.constant(np.ones(3, np.float32)),
                                       args=bwd.grad_graph_info.inputs_dict(info))[0])
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run()[d], np.full((2, 3), 2.0))


def test_strided_variants_are_their_own_op_with_gradients():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        grp = ir.replica_grouping(stride=2, group_size=2)
        for fn in (replicated_all_reduce_strided, replicated_all_reduce_strided_identical_inputs,
                   replicated_all_reduce_strided_identical_grad_inputs):
            y = fn(x, "mean", grp)
            op = ir.main_graph._data.producer[y.id]
            assert op.type == "ReplicatedAllReduceStrided"
            assert (op.attrs["stride"], op.attrs["group_size"], op.attrs["op"]) == (2, 2, "mean")
        with pytest.raises(ValueError, match="op must be one of"):
            replicated_all_reduce_strided_identical_inputs(x, "max")


def test_patterns_api():
    assert list(patterns_level) == ["no_patterns", "minimal", "default", "all"]
    ir = popxl.Ir()
    with pytest.raises(ValueError, match="level must be one of"):
        apply_pre_alias_patterns(ir, "aggressive")
    with pytest.raises(TypeError, match="popxl.Ir"):
        apply_pre_alias_patterns("ir")


def test_errors():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros(3, np.float32), name="x")
        with pytest.raises(ValueError, match="^Not a valid op: sum. Must choose from: "):
            replicated_all_reduce_identical_inputs(x, "sum")
        with pytest.raises(TypeError, match="'group' must be a popxl.ReplicaGrouping"):
            replicated_all_reduce(x, group=2)
        with pytest.raises(TypeError, match="must be a popxl.Tensor"):
            replicated_all_reduce(np.zeros(3))
        other = popxl.Ir(replication=2)
        with pytest.raises(ValueError, match="another Ir"):
            replicated_all_reduce(x, group=other.replica_grouping())
        g = ir.create_graph(lambda t: replicated_all_reduce(t, "max"), x.spec)
        with pytest.raises(NotImplementedError, match="'add' and 'mean'"):
            addons.autodiff(g)


@pytest.mark.parametrize("build", [
    lambda x, ir: replicated_all_reduce_identical_inputs(x),
    lambda x, ir: replicated_all_reduce_identical_grad_inputs(x),
    lambda x, ir: replicated_all_reduce_strided(x, group=ir.replica_grouping(2, 2)),
])
def test_gradient_graphs_take_the_gradient_alone(build):
    """As upstream's grad ops, the gradient of these all-reduces needs no forward tensor: the
    gradient graph has one input (upstream's tests call it with the gradient alone)."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((2, 3), popxl.float32, "x"), "x")
        g = ir.create_graph(lambda t: build(t, ir), x)
    info = popxl.transforms.autodiff(g)
    assert [e.connection_type.name for e in info.expected_inputs] == ["FwdGrad"]
    assert len(info.graph.inputs) == 1
