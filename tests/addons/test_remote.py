"""popxl_addons.remote: named buffers, remote (RTS) variables from factories, and the load /
store graphs, against NumPy references written here.

Programs run on the local backend with R = 2 or 4 replicas, on one worker and on two worker
threads (POPXL_WORKERS unset / "2"). RTS layout reference: the flattened value, zero-padded,
cut into contiguous chunks; replica r (all-replica grouping) holds chunk r % shard_over.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import popxl
import popxl_addons as addons
import pytest
from popxl import ops
from popxl_addons.remote import (
    NamedRemoteBuffers,
    create_remote_buffer,
    load_remote,
    load_remote_graph,
    named_buffers,
    named_variable_buffers,
    store_remote,
    store_remote_graph,
)


@pytest.fixture(params=[None, "2"], ids=["1worker", "2workers"])
def workers(request, monkeypatch):
    monkeypatch.setenv("POPXL_BACKEND", "local")
    if request.param is None:
        monkeypatch.delenv("POPXL_WORKERS", raising=False)
    else:
        monkeypatch.setenv("POPXL_WORKERS", request.param)
    return request.param


def ref_chunk(value: np.ndarray, k: int, i: int) -> np.ndarray:
    flat = value.reshape(-1)
    c = -(-flat.size // k)
    padded = np.zeros(k * c, flat.dtype)
    padded[:flat.size] = flat
    return padded[i * c:(i + 1) * c]


def test_exports():
    for name in ("load_remote_graph", "store_remote_graph", "named_buffers",
                 "named_variable_buffers", "create_remote_buffer"):
        assert getattr(addons, name) is getattr(addons.remote, name)
    assert addons.remote.NamedRemoteBuffers is NamedRemoteBuffers


# --- buffer creation ---------------------------------------------------------------------------
def test_create_remote_buffer():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        plain = create_remote_buffer(popxl.TensorSpec((2, 3), popxl.float16), entries=3)
        assert (plain.tensor_shape, plain.tensor_dtype, plain.entries, plain.meta_shape) == \
            ((2, 3), popxl.float16, 3, ())
        # A spec that already is a shard: its own shape, with the meta_shape.
        shard = create_remote_buffer(popxl.TensorSpec((3,), popxl.float32, (2, 6)))
        assert (shard.tensor_shape, shard.meta_shape) == ((3,), (2, 6))
        rts = create_remote_buffer(popxl.TensorSpec((4, 6), popxl.float32), shard_over=4)
        assert (rts.tensor_shape, rts.meta_shape) == ((6,), (4, 6))
        # Two groups of two: per-group shards over 2 replicas.
        rg = ir.replica_grouping(group_size=2)
        grouped = create_remote_buffer(popxl.TensorSpec((4, 6), popxl.float32), 2, rg, 2)
        assert (grouped.tensor_shape, grouped.meta_shape, grouped.entries) == \
            ((12,), (4, 6), 2)
        with pytest.raises(ValueError, match="Can't shard tensor with 10 elements over 4"):
            create_remote_buffer(popxl.TensorSpec((10,), popxl.float32), shard_over=4)
        with pytest.raises(TypeError, match="TensorSpec"):
            create_remote_buffer((2, 3))
        with pytest.raises(ValueError, match="entries"):
            create_remote_buffer(popxl.TensorSpec((2,), popxl.float32), entries=0)
        with pytest.raises(ValueError, match="shard_over"):
            create_remote_buffer(popxl.TensorSpec((2,), popxl.float32), shard_over=0)


def test_named_buffers_works():
    """Upstream's named_buffers always raises TypeError; this one makes one buffer per tensor."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        nt = addons.NamedTensors.from_dict({
            "fc.weight": popxl.variable(np.zeros((4, 8), np.float32), name="w"),
            "fc.bias": popxl.variable(np.zeros((3,), np.float32), name="b")})
        whole = named_buffers(nt, entries=2)
        assert isinstance(whole, NamedRemoteBuffers)
        assert list(whole.to_dict()) == ["fc.weight", "fc.bias"]
        assert whole.fc.weight.tensor_shape == (4, 8) and whole.fc.weight.entries == 2
        assert not whole.fc.weight.meta_shape
        sharded = named_buffers(nt, shard_over=ir.replica_grouping())
        assert (sharded.fc.weight.tensor_shape, sharded.fc.weight.meta_shape) == ((8,), (4, 8))
        # 3 elements cannot be split over 4: stays whole.
        assert (sharded.fc.bias.tensor_shape, sharded.fc.bias.meta_shape) == ((3,), ())
        assert named_buffers(nt, shard_over=2).fc.weight.tensor_shape == (16,)
        with pytest.raises(TypeError, match="NamedTensors"):
            named_buffers({"a": nt.fc.bias})


def _facts(ir) -> addons.NamedVariableFactories:
    rng = np.random.default_rng(0)
    return addons.NamedVariableFactories.from_dict({
        "w": addons.VariableFactory(partial(rng.normal, 0, 1, (4, 3)), popxl.float32, "w"),
        "b": addons.VariableFactory(partial(rng.normal, 0, 1, (4,)), popxl.float32, "b"),
    })


def test_named_variable_buffers_shard_over():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        facts = _facts(ir)
        default = named_variable_buffers(facts)                   # True: group size 4
        assert (default.w.tensor_shape, default.w.meta_shape) == ((3,), (4, 3))
        assert (default.b.tensor_shape, default.b.meta_shape) == ((1,), (4,))
        off = named_variable_buffers(facts, entries=3, shard_over_dict=False)
        assert off.w.tensor_shape == (4, 3) and not off.w.meta_shape and off.w.entries == 3
        two = named_variable_buffers(facts, shard_over_dict=2)
        assert two.w.tensor_shape == (6,) and two.b.tensor_shape == (2,)
        mixed = named_variable_buffers(facts, shard_over_dict={"b": False})
        assert mixed.w.tensor_shape == (3,) and mixed.b.tensor_shape == (4,)
        with pytest.raises(ValueError, match="between 1 and the replica group size 4"):
            named_variable_buffers(facts, shard_over_dict=8)
        with pytest.raises(ValueError, match="Can't shard tensor with 4 elements over 3"):
            named_variable_buffers(facts, shard_over_dict={"w": False, "b": 3})
        with pytest.raises(ValueError, match="divide the replica group size 4"):
            named_variable_buffers(facts, shard_over_dict={"w": 3, "b": 1})
        with pytest.raises(TypeError, match="bool or an int"):
            named_variable_buffers(facts, shard_over_dict="yes")


# --- running programs ---------------------------------------------------------------------------
@pytest.mark.parametrize("R", [2, 4])
def test_init_remote_load_update_store_graphs(workers, R):
    """Factories -> named_variable_buffers -> init_remote; each run loads every buffer with the
    load graph, adds 1 (weight shard) / the replica-independent 2 (bias, whole), stores back
    with the store graph. The host sees the full values; each replica loaded its own shard."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        facts = _facts(ir)
        bufs = named_variable_buffers(facts, shard_over_dict={"b": False})
        variables = facts.init_remote(bufs, prefix="model")
        assert variables.w.name == "model.w" and variables.w.shape == (4, 3)
        load, names = load_remote_graph(bufs)
        assert names == ["b", "w"] and load.graph.name.startswith("load_remote")
        (index,) = load.graph.inputs
        assert (index.name, index.shape, index.dtype) == ("load_index", (), popxl.int32)
        store = store_remote_graph(bufs)
        assert store.graph.inputs[0].name == "store_index"
        assert store.args.w.shape == (12 // R,) and store.args.w.meta_shape == (4, 3)
        with popxl.in_sequence():
            loaded = addons.NamedTensors.pack(names, load.call(0))
            seen = popxl.d2h_stream(loaded.w.shape, loaded.w.dtype, "seen")
            ops.host_store(seen, loaded.w)
            updated = addons.NamedTensors.from_dict({"w": loaded.w + 1.0,
                                                     "b": loaded.b + 2.0})
            store.bind(updated).call(0)
    with popxl.Session(ir, "ipu_hw") as sess:
        start = sess.get_tensors_data(variables.tensors)
        w0, b0 = start[variables.w].copy(), start[variables.b].copy()
        out = sess.run()
        sess.run()
        end = sess.get_tensors_data(variables.tensors)
    for r in range(R):
        np.testing.assert_array_equal(out[seen][r], ref_chunk(w0, R, r))
    np.testing.assert_allclose(end[variables.w], w0 + 2.0, rtol=1e-6)
    np.testing.assert_allclose(end[variables.b], b0 + 4.0, rtol=1e-6)


@pytest.mark.parametrize("R", [2, 4])
def test_entries_and_runtime_index(workers, R):
    """load/store graphs with `entries` grow the buffers; the entry is picked at run time from
    a host stream. Every replica writes replica-specific values into entry i and reads entry
    j back."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        bufs = NamedRemoteBuffers.from_dict({
            "a": popxl.remote_buffer((2, 2), popxl.float32),
            "b.c": popxl.remote_buffer((3,), popxl.int32)})
        load, names = load_remote_graph(bufs, entries=3)
        store = store_remote_graph(bufs, entries=2)           # never shrinks
        assert bufs.a.entries == 3 and bufs.b.c.entries == 3
        idx_s = popxl.h2d_stream((2,), popxl.int32, "idx")
        val_s = popxl.h2d_stream((2, 2), popxl.float32, "val")
        with popxl.in_sequence():
            idx = ops.host_load(idx_s, "idx")
            val = ops.host_load(val_s, "val")
            i, j = idx[0], idx[1]
            c = ops.cast(val.reshape((4,))[:3], popxl.int32)
            store.bind(addons.NamedTensors.from_dict({"a": val, "b.c": c})).call(i)
            got = addons.NamedTensors.pack(names, load.call(j))
            outs = {k: popxl.d2h_stream(t.shape, t.dtype, k) for k, t in got.to_dict().items()}
            for k, t in got.to_dict().items():
                ops.host_store(outs[k], t)
    vals = np.arange(R * 4, dtype=np.float32).reshape(R, 2, 2)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({idx_s: np.tile([[2, 0]], (R, 1)).astype(np.int32), val_s: vals})
        res = sess.run({idx_s: np.tile([[1, 2]], (R, 1)).astype(np.int32), val_s: vals + 100})
    for r in range(R):
        np.testing.assert_array_equal(res[outs["a"]][r], vals[r])             # from run 1
        np.testing.assert_array_equal(res[outs["b.c"]][r], vals[r].reshape(-1)[:3])


@pytest.mark.parametrize("R", [2, 4])
def test_inline_load_store(workers, R):
    """`load_remote` / `store_remote` (no graphs) on RTS and whole remote variables."""
    w0 = np.arange(10, dtype=np.float32).reshape(2, 5)         # 10 elements: padded for R=4
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        buf = popxl.replica_sharded_buffer((2, 5), popxl.float32)
        w = popxl.remote_replica_sharded_variable(w0, buf, name="w")
        vbuf = popxl.remote_buffer((3,), popxl.float32)
        v = popxl.remote_variable(np.ones(3, np.float32), vbuf, name="v")
        bufs = NamedRemoteBuffers.from_dict({"w": buf, "v": vbuf})
        with popxl.in_sequence():
            t = load_remote(bufs)
            assert t.w.meta_shape == (2, 5) and t.w.shape == (-(-10 // R),)
            store_remote(bufs, addons.NamedTensors.from_dict({"w": t.w * 2.0, "v": t.v - 1.0}))
        with pytest.raises(ValueError, match="missing tensors \\['v'\\]"):
            store_remote(bufs, addons.NamedTensors.from_dict({"w": t.w}))
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(w), 4 * w0)
        np.testing.assert_array_equal(sess.get_tensor_data(v), -np.ones(3, np.float32))


def test_grouped_rts_factories_round_trip(workers):
    """R=4, factories grouped in 2 groups: init_remote stores each group's own draw, sharded
    over the 2 members of the group; the host reads back one full value per group."""
    R = 4
    ir = popxl.Ir(replication=R)
    draws = [np.full((2, 2), i, np.float32) for i in range(1, 5)]
    with ir.main_graph:
        rg = ir.replica_grouping(group_size=2)
        facts = addons.NamedVariableFactories.from_dict(
            {"w": addons.VariableFactory(iter(draws), popxl.float32, "w", replica_grouping=rg)})
        bufs = named_variable_buffers(facts)
        assert bufs.w.tensor_shape == (2,) and bufs.w.meta_shape == (2, 2)
        var = facts.init_remote(bufs).w
        shard = load_remote(bufs).w
        out = popxl.d2h_stream(shard.shape, shard.dtype, "shard")
        ops.host_store(out, shard)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
        host = sess.get_tensor_data(var)
    # The peeked first draw and the next one, one per group (VariableFactory order).
    np.testing.assert_array_equal(host, np.stack([draws[0], draws[1]]))
    for r in range(R):
        np.testing.assert_array_equal(res[out][r], ref_chunk(host[r // 2], 2, r % 2))
