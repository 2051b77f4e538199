"""popxl_addons.rts and the strided collectives, against NumPy references written here.

Every program runs on the local backend with R = 2 or 4 replicas, on one worker and on two
worker threads (POPXL_WORKERS unset / "2"). References use the strided group formula of the
addons reference: replica r is in group {base + i*stride}, base = (r // (stride*size)) *
stride*size + r % stride, with rank (r % (stride*size)) // stride; shards are contiguous chunks
of the flattened, zero-padded tensor.
"""
from __future__ import annotations

import numpy as np
import popxl
import popxl_addons as addons
import pytest
from popxl import ops
from popxl_addons.ops.replicated_strided_collectives import (
    replicated_all_gather_strided,
    replicated_all_reduce_strided,
    replicated_all_reduce_strided_graph,
    replicated_reduce_scatter_strided,
)
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_addons.rts import (
    all_gather_replica_sharded_graph,
    gather_replica_sharded_tensor,
    reduce_replica_sharded_graph,
    reduce_replica_sharded_tensor,
    replica_sharded_spec,
)


@pytest.fixture(params=[None, "2"], ids=["1worker", "2workers"])
def workers(request, monkeypatch):
    monkeypatch.setenv("POPXL_BACKEND", "local")
    if request.param is None:
        monkeypatch.delenv("POPXL_WORKERS", raising=False)
    else:
        monkeypatch.setenv("POPXL_WORKERS", request.param)
    return request.param


# --- NumPy references ------------------------------------------------------------------------
def ref_group(r: int, stride: int, size: int) -> list[int]:
    """Members of replica r's group, in rank order."""
    base = (r // (stride * size)) * stride * size + r % stride
    return [base + i * stride for i in range(size)]


def ref_rank(r: int, stride: int, size: int) -> int:
    return (r % (stride * size)) // stride


def ref_chunks(flat: np.ndarray, k: int) -> np.ndarray:
    """(k, ceil(n/k)): the zero-padded flat data cut into k contiguous chunks."""
    c = -(-flat.size // k)
    padded = np.zeros(k * c, flat.dtype)
    padded[:flat.size] = flat
    return padded.reshape(k, c)


def run_per_replica(R: int, data, build) -> list[np.ndarray]:
    """Load `data[r]` (or each array of a list `data`) on replica r, call `build(ir, *xs)` in
    the main graph (it returns tensors) and return each output as (R, *shape)."""
    arrays = data if isinstance(data, list) else [data]
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        streams = [popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype), f"x{i}")
                   for i, a in enumerate(arrays)]
        outs = build(ir, *[ops.host_load(s, f"x{i}") for i, s in enumerate(streams)])
        d2h = []
        for i, o in enumerate(outs):
            d = popxl.d2h_stream(o.shape, o.dtype, f"out{i}")
            ops.host_store(d, o)
            d2h.append(d)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run(dict(zip(streams, arrays)))
    return [res[d] for d in d2h]


def per_replica_data(R: int, shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(R, *shape)).astype(np.float32)


GROUPINGS = [(4, 1, 4), (4, 1, 2), (4, 2, 2), (2, 1, 2)]          # (R, stride, group_size)


# --- replica_sharded_spec --------------------------------------------------------------------
def test_replica_sharded_spec():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        t = popxl.variable(np.zeros((4, 6), np.float32), name="t")
        spec = replica_sharded_spec(t, ir.replica_grouping())
        assert spec == popxl.TensorSpec((6,), popxl.float32, (4, 6))
        assert replica_sharded_spec(t, 2) == popxl.TensorSpec((12,), popxl.float32, (4, 6))
        # Group of one, not divisible, already sharded: the tensor's own spec.
        assert replica_sharded_spec(t, ir.replica_grouping(group_size=1)) == t.spec
        odd = popxl.variable(np.zeros((5,), np.float32), name="odd")
        assert replica_sharded_spec(odd, ir.replica_grouping()) == odd.spec
        assert replica_sharded_spec(spec, 4) == spec
        with pytest.raises(TypeError, match="shard_over"):
            replica_sharded_spec(t, "4")
        with pytest.raises(TypeError, match="'t'"):
            replica_sharded_spec(np.zeros(3), 2)


# --- strided collectives ---------------------------------------------------------------------
@pytest.mark.parametrize("R,stride,size", GROUPINGS)
def test_all_gather_strided(workers, R, stride, size):
    data = per_replica_data(R, (3, 2))

    def build(ir, x):
        g = ir.replica_grouping(stride=stride, group_size=size)
        flat = replicated_all_gather_strided(x, group=g)
        shard = ops.collectives.replica_sharded_slice(x, group=g)        # meta_shape (3, 2)
        full = replicated_all_gather_strided(shard, group=g)
        return [flat, full]

    flat, full = run_per_replica(R, data, build)
    assert flat.shape == (R, size * 6) and full.shape == (R, 3, 2)
    for r in range(R):
        members = ref_group(r, stride, size)
        np.testing.assert_array_equal(flat[r], np.concatenate([data[m].reshape(-1)
                                                               for m in members]))
        # Member i contributes chunk i of its own data.
        ref = np.concatenate([ref_chunks(data[m].reshape(-1), size)[i]
                              for i, m in enumerate(members)])[:6].reshape(3, 2)
        np.testing.assert_array_equal(full[r], ref)


@pytest.mark.parametrize("R,stride,size", GROUPINGS)
@pytest.mark.parametrize("op", ["add", "mean"])
def test_reduce_scatter_and_all_reduce_strided(workers, R, stride, size, op):
    data = per_replica_data(R, (5,), seed=1)       # 5 elements: padded when size > 1
    seen = {}

    def build(ir, x):
        g = ir.replica_grouping(stride=stride, group_size=size)
        rs = replicated_reduce_scatter_strided(x, op, g)
        rts = replicated_reduce_scatter_strided(
            x, op, g, configure_output_for_replicated_tensor_sharding=True)
        seen["meta"] = (rs.meta_shape, rts.meta_shape)
        return [rs, replicated_all_reduce_strided(x, op, g)]

    rs, ar = run_per_replica(R, data, build)
    assert seen["meta"] == ((), (5,))
    chunk = -(-5 // size)
    assert rs.shape == (R, chunk)
    for r in range(R):
        members = ref_group(r, stride, size)
        total = np.zeros(5, np.float32)
        for m in members:                                 # ascending member order
            total = total + data[m]
        if op == "mean":
            total = total / np.float32(size)
        np.testing.assert_allclose(ar[r], total, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(rs[r], ref_chunks(total, size)[ref_rank(r, stride, size)],
                                   rtol=1e-6, atol=1e-6)


def test_strided_collective_errors():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros(4, np.float32), name="x")
        with pytest.raises(ValueError, match="op must be one of"):
            replicated_reduce_scatter_strided(x, "max")
        with pytest.raises(ValueError, match="op must be one of"):
            replicated_all_reduce_strided(x, "mul")
        with pytest.raises(TypeError, match="group"):
            replicated_all_gather_strided(x, group=2)
        with pytest.raises(TypeError, match="popxl.Tensor"):
            replicated_all_gather_strided(np.zeros(4))


def test_all_reduce_strided_graph(workers):
    R = 4
    data = per_replica_data(R, (2, 3), seed=2)

    def build(ir, x):
        y = x * 2.0
        g = ir.replica_grouping(stride=2, group_size=2)
        graph, names = replicated_all_reduce_strided_graph(
            addons.NamedTensors.from_dict({"b": y, "a": x}), "add", g)
        assert names == ["a", "b"] and graph.graph.name.startswith("all_reduce_strided")
        a, b = graph.bind(addons.NamedTensors.from_dict({"a": x, "b": y})).call()
        return [a, b]

    a, b = run_per_replica(R, data, build)
    for r in range(R):
        ref = sum(data[m] for m in ref_group(r, 2, 2))
        np.testing.assert_allclose(a[r], ref, rtol=1e-6)
        np.testing.assert_allclose(b[r], 2 * ref, rtol=1e-6)


# --- gather / reduce of replica-sharded tensors -----------------------------------------------
def test_gather_replica_sharded_tensor_passes_unsharded_through():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 2), np.float32), name="x")
        assert gather_replica_sharded_tensor(x) is x


@pytest.mark.parametrize("R", [2, 4])
def test_reduce_replica_sharded_tensor(workers, R):
    data = per_replica_data(R, (4, 2), seed=3)
    odd = per_replica_data(R, (3,), seed=4)
    half = R // 2

    def build(ir, x, y):
        all_r = ir.replica_grouping()
        halves = ir.replica_grouping(group_size=half)
        scattered = reduce_replica_sharded_tensor(x, "mean")          # shard group = all
        sliced = reduce_replica_sharded_tensor(x, "add", all_r, halves)
        whole = reduce_replica_sharded_tensor(y, "add")                  # 3 not divisible
        assert scattered.shape == (8 // R,) and scattered.meta_shape == (4, 2)
        # A shard group of one replica (R=2) means no sharding: the full all-reduce.
        assert sliced.shape == ((8 // half,) if half > 1 else (4, 2))
        assert sliced.meta_shape == ((4, 2) if half > 1 else ())
        assert whole.shape == (3,) and not whole.meta_shape
        return [scattered, sliced, whole]

    scattered, sliced, whole = run_per_replica(R, [data, odd], build)
    total = np.zeros(8, np.float32)
    for r in range(R):
        total = total + data[r].reshape(-1)
    odd_total = np.zeros(3, np.float32)
    for r in range(R):
        odd_total = odd_total + odd[r]
    for r in range(R):
        np.testing.assert_allclose(scattered[r], ref_chunks(total / np.float32(R), R)[r],
                                   rtol=1e-6)
        ref_sliced = ref_chunks(total, half)[r % half] if half > 1 else total.reshape(4, 2)
        np.testing.assert_allclose(sliced[r], ref_sliced, rtol=1e-6)
        np.testing.assert_allclose(whole[r], odd_total, rtol=1e-6)


def test_reduce_replica_sharded_graph(workers):
    R = 4
    data = per_replica_data(R, (4, 2), seed=5)

    def build(ir, x):
        tensors = addons.NamedTensors.from_dict({"w": x, "b": x + 1.0})
        groups = addons.NamedReplicaGrouping.from_dict(
            {"w": ir.replica_grouping(), "b": ir.replica_grouping(group_size=1)})
        graph, names = reduce_replica_sharded_graph(tensors, "add", shard_groups=groups)
        assert names == ["b", "w"]
        b, w = graph.bind(tensors).call()
        assert w.shape == (2,) and w.meta_shape == (4, 2) and b.shape == (4, 2)
        # Gather the shard back in a graph: the full sum on every replica.
        gather, gnames = all_gather_replica_sharded_graph(
            addons.NamedTensors.from_dict({"w": w, "b": b}))
        assert gnames == ["b", "w"]
        gb, gw = gather.bind(addons.NamedTensors.from_dict({"w": w, "b": b})).call()
        return [w, b, gw, gb]

    w, b, gw, gb = run_per_replica(R, data, build)
    total = np.zeros((4, 2), np.float32)
    for r in range(R):
        total = total + data[r]
    for r in range(R):
        np.testing.assert_allclose(w[r], ref_chunks(total.reshape(-1), R)[r], rtol=1e-6)
        np.testing.assert_allclose(b[r], total + R, rtol=1e-6)
        np.testing.assert_allclose(gw[r], total, rtol=1e-6)
        np.testing.assert_allclose(gb[r], total + R, rtol=1e-6)


@pytest.mark.parametrize("stride", [1, 2])
def test_gather_grouped_rts_variables(workers, stride):
    """R=4, variables grouped (stride s, group size 2), sharded over 2: gathered over the
    grouping (stride s, size 2), every replica sees its own group's value."""
    R = 4
    rng = np.random.default_rng(6)
    data = rng.normal(size=(2, 2, 3)).astype(np.float32)       # one value per group
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(stride=stride, group_size=2)
        facts = addons.NamedVariableFactories.from_dict(
            {"w": addons.VariableFactory(iter([data[0], data[1]]), popxl.float32, "w",
                                         replica_grouping=rg)})
        bufs = addons.named_variable_buffers(facts)
        assert bufs.w.tensor_shape == (3,) and bufs.w.meta_shape == (2, 3)
        var = facts.init_remote(bufs).w
        shards = addons.remote.load_remote(bufs)
        graph, _ = all_gather_replica_sharded_graph(
            shards, replica_groups=addons.NamedReplicaGrouping.from_dict(
                {"w": ir.replica_grouping(stride=stride, group_size=2)}))
        (full,) = graph.bind(shards).call()
        out = popxl.d2h_stream(full.shape, full.dtype, "full")
        ops.host_store(out, full)
        sh_out = popxl.d2h_stream(shards.w.shape, shards.w.dtype, "shard")
        ops.host_store(sh_out, shards.w)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(var), data)
    for r in range(R):
        g = r % stride + stride * (r // (stride * 2))                  # variable group of r
        np.testing.assert_array_equal(res[out][r], data[g])
        np.testing.assert_array_equal(res[sh_out][r],
                                      ref_chunks(data[g].reshape(-1), 2)[ref_rank(r, stride, 2)])


# --- Adam on a shard ---------------------------------------------------------------------------
def test_adam_state_sharded_and_update_matches_numpy(workers):
    """AdamOptimizerStep on an RTS shard has sharded moments, and updating each replica's
    shard equals the shard of the full NumPy Adam update."""
    R, lr, b1, b2, eps = 4, 0.1, 0.9, 0.999, 1e-5
    rng = np.random.default_rng(7)
    w0 = rng.normal(size=(5, 2)).astype(np.float32)           # 10 elements: padded to 12
    grads = rng.normal(size=(R, 5, 2)).astype(np.float32)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        gs = popxl.h2d_stream((5, 2), popxl.float32, "g")
        var, shard = popxl.replica_sharded_variable(w0, name="w")
        g = ops.host_load(gs, "g")
        g_shard = replicated_reduce_scatter_strided(
            g, "mean", configure_output_for_replicated_tensor_sharding=True)
        facts, graph = AdamOptimizerStep().create_graph(shard, g_shard.spec, lr=lr,
                                                        weight_decay=0.0,
                                                        first_order_dtype=popxl.float32)
        for key in ("first_order", "second_order"):
            f = facts.get(key)
            assert f.shape == (3,) and f.meta_shape == (5, 2), key
        assert facts.step.shape == ()
        # Sharded state lives in remote buffers (`init` would make full variables).
        moments = facts.filter_keys(["first_order", "second_order"])
        bufs = addons.named_variable_buffers(moments)
        state_vars = moments.init_remote(bufs, prefix="adam")
        state = addons.remote.load_remote(bufs)
        state.insert("step", facts.filter_keys(["step"]).init(prefix="adam").step)
        graph.bind(state).call(shard, g_shard)
        addons.remote.store_remote(bufs, state.filter_keys(["first_order", "second_order"]))
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({gs: grads})
        got = sess.get_tensor_data(var)
        m = sess.get_tensor_data(state_vars.first_order)
        assert sess.get_tensor_data(state.step) == 1
    mean = np.zeros((5, 2), np.float32)
    for r in range(R):
        mean = mean + grads[r]
    mean = mean / np.float32(R)
    m_ref = (1 - b1) * mean.astype(np.float64)
    v_ref = (1 - b2) * mean.astype(np.float64) ** 2
    ref = w0 - lr * (m_ref / (1 - b1)) / (np.sqrt(v_ref / (1 - b2)) + eps)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_gather_rts_variables_with_the_2d_tensor_parallel_grouping(workers):
    """R=8, factories grouped by the non-constant [0, 0, 1, 1, 0, 0, 1, 1] (the transpose of TP1
    (stride 2, size 2)), buffers sharded over its const_rg groups of 2 (as GPT-3 175B builds
    them): each pair of replicas holds one copy of its group's value in 2 shards, and the
    gather over the grouping (mapped to const_rg, as upstream) gives every replica its value."""
    R = 8
    assignment = [0, 0, 1, 1, 0, 0, 1, 1]
    data = np.random.default_rng(7).normal(size=(2, 6)).astype(np.float32)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(stride=2, group_size=2).transpose()
        assert rg.assignment == assignment and rg.const_rg.group_size == 2
        facts = addons.NamedVariableFactories.from_dict(
            {"w": addons.VariableFactory(iter([data[0], data[1]]), popxl.float32, "w",
                                         replica_grouping=rg)})
        bufs = addons.named_variable_buffers(facts, shard_over_dict={"w": 2})
        assert bufs.w.tensor_shape == (3,) and bufs.w.meta_shape == (6,)
        var = facts.init_remote(bufs).w
        shards = addons.remote.load_remote(bufs)
        graph, _ = all_gather_replica_sharded_graph(
            shards, replica_groups=addons.NamedReplicaGrouping.from_dict({"w": rg}))
        (full,) = graph.bind(shards).call()
        out = popxl.d2h_stream(full.shape, full.dtype, "full")
        ops.host_store(out, full)
        sh_out = popxl.d2h_stream(shards.w.shape, shards.w.dtype, "shard")
        ops.host_store(sh_out, shards.w)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(var), data)
        sess.write_variable_data(var, data[::-1].copy())
        again = sess.run()
    for r in range(R):
        g = assignment[r]
        np.testing.assert_array_equal(res[out][r], data[g])
        np.testing.assert_array_equal(res[sh_out][r], ref_chunks(data[g], 2)[r % 2])
        np.testing.assert_array_equal(again[out][r], data[1 - g])


def test_strided_collectives_refuse_non_constant_groupings():
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        x = popxl.variable(np.zeros(4, np.float32), name="x")
        rg = ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
        for fn in (replicated_all_gather_strided, replicated_all_reduce_strided,
                   replicated_reduce_scatter_strided):
            with pytest.raises(NotImplementedError, match="constant stride"):
                fn(x, group=rg)
