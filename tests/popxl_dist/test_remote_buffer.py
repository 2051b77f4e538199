"""Remote buffers, remote variables and replicated tensor sharding (RTS).

Session tests run on the local backend with one worker and with 2 worker threads and expect the
same results. References are NumPy written here: per-replica buffer copies, the constant-stride
grouping formulas of the spec (§1.10) and contiguous zero-padded RTS chunks (§6).
"""
import math

import numpy as np
import pytest
import popxl
from popxl import ops

C = ops.collectives


@pytest.fixture(params=[None, "2"], ids=["1worker", "2workers"])
def workers(request, monkeypatch):
    """Worker layout of the local backend (read when the Session is created)."""
    monkeypatch.setenv("POPXL_BACKEND", "local")
    if request.param is None:
        monkeypatch.delenv("POPXL_WORKERS", raising=False)
    else:
        monkeypatch.setenv("POPXL_WORKERS", request.param)
    return request.param


# --- references ----------------------------------------------------------------------------
def ref_group(r: int, stride: int, size: int) -> int:
    return r % stride + stride * (r // (stride * size))


def ref_members(r: int, stride: int, size: int) -> list:
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


def ref_chunk(value: np.ndarray, i: int, k: int) -> np.ndarray:
    """Chunk i of the flattened value, zero-padded to k * ceil(n / k)."""
    flat = np.asarray(value).reshape(-1)
    c = -(-flat.size // k)
    padded = np.concatenate([flat, np.zeros(c * k - flat.size, flat.dtype)])
    return padded[i * c:(i + 1) * c]


def store_out(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


# --- RemoteBuffer ---------------------------------------------------------------------------
def test_remote_buffer_ids_and_properties():
    for _ in range(2):                                   # ids restart at 1 for every Ir
        ir = popxl.Ir()
        with ir.main_graph:
            a = popxl.remote_buffer((2, 3), popxl.float16, 4)
            b = popxl.RemoteBuffer((5,), popxl.int32, 1)
            c = popxl.remote_buffer((), popxl.uint32)
        assert [x.remote_buffer_id for x in (a, b, c)] == [1, 2, 3]
    assert a.tensor_shape == (2, 3) and a.tensor_dtype == popxl.float16 and a.entries == 4
    assert b.tensor_shape == (5,) and b.tensor_dtype == popxl.int32 and b.entries == 1
    assert c.tensor_shape == () and c.entries == 1
    assert a.meta_shape == ()
    a.entries = 6
    a.meta_shape = (4, 3)
    assert a.entries == 6 and a.meta_shape == (4, 3)
    assert a != b and hash(a) == hash(a)
    with ir.main_graph:
        assert popxl.remote_buffer((1,), popxl.float32) != a         # a new id
    assert len({a, b, c}) == 3


def test_remote_buffer_errors():
    with pytest.raises(RuntimeError, match="no graph"):
        popxl.remote_buffer((2,), popxl.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
            popxl.remote_buffer((2,), popxl.float32, 0)
        with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
            popxl.RemoteBuffer((2,), popxl.float32, -1)
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
            buf.entries = 0
        assert buf.entries == 2


def test_validate_tensor_matches_buffer():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2, 5), popxl.float32)
        ok = popxl.variable(np.zeros((2, 5), np.float32), name="ok")
        buf.validate_tensor_matches_buffer(ok)
        bad_shape = popxl.variable(np.zeros((5, 2), np.float32), name="bad_shape")
        with pytest.raises(ValueError, match=r"(?s)^Tensor bad_shape does not match buffer.*shape=\(2, 5\).*shape=\(5, 2\)"):
            buf.validate_tensor_matches_buffer(bad_shape)
        bad_dtype = popxl.variable(np.zeros((2, 5), np.float16), name="bad_dtype")
        with pytest.raises(ValueError, match=r"(?s)^Tensor bad_dtype does not match buffer.*float32.*float16"):
            buf.validate_tensor_matches_buffer(bad_dtype)
        # Sharded: 10 elements over 4 shards -> 1-D shards of 3.
        shard = popxl.variable(np.zeros((3,), np.float32), name="shard")
        buf.validate_tensor_matches_buffer(shard, num_shards=4)
        with pytest.raises(ValueError, match="shard"):
            buf.validate_tensor_matches_buffer(shard, num_shards=2)


def test_buffer_frozen_after_session():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 1)
        ops.remote_load(buf, 0)
    popxl.Session(ir, "ipu_hw")
    with pytest.raises(ValueError, match="Session"):
        buf.entries = 3


# --- remote_load / remote_store: build time ------------------------------------------------
def test_remote_load_names_meta_shape_and_inplace():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((6,), popxl.float32, 2)
        buf.meta_shape = (2, 3)
        d = ops.remote_load(buf, 0)                      # int offset: uint32 const "offset"
        assert d.name == "id_1_offset_offset_remote_loaded"
        x = ops.remote_load(buf, 1, "x")
        assert x.name == "x_remote_loaded" and x.shape == (6,) and x.dtype == popxl.float32
        assert x.meta_shape == (2, 3)
        t = popxl.variable(np.zeros(6, np.float32), name="t")
        y = ops.remote_load_(buf, 0, t)
        assert y.name == "t_remote_loaded" and y.shape == (6,) and y.meta_shape == (2, 3)
        plain = popxl.remote_buffer((4,), popxl.int32)
        assert ops.remote_load(plain, 0).meta_shape == ()


def test_remote_op_build_errors():
    ir = popxl.Ir()
    other = popxl.Ir()
    with other.main_graph:
        foreign = popxl.remote_buffer((2,), popxl.float32)
    with ir.main_graph:
        buf = popxl.remote_buffer((2, 3), popxl.float32, 2)
        good = popxl.variable(np.zeros((2, 3), np.float32), name="good")
        wrong_shape = popxl.variable(np.zeros((3, 2), np.float32), name="wrong_shape")
        wrong_dtype = popxl.variable(np.zeros((2, 3), np.int32), name="wrong_dtype")
        with pytest.raises(ValueError, match=r"(?s)wrong_shape does not match buffer.*remote buffer 1.*\(3, 2\)"):
            ops.remote_store(buf, 0, wrong_shape)
        with pytest.raises(ValueError, match=r"(?s)wrong_dtype does not match buffer.*remote buffer 1.*int32"):
            ops.remote_store(buf, 0, wrong_dtype)
        with pytest.raises(ValueError, match=r"(?s)wrong_shape does not match buffer.*remote buffer 1"):
            ops.remote_load_(buf, 0, wrong_shape)
        with pytest.raises(ValueError, match="offset 2.*remote buffer 1"):
            ops.remote_load(buf, 2)
        with pytest.raises(ValueError, match="offset -1.*remote buffer 1"):
            ops.remote_store(buf, -1, good)
        f_off = popxl.variable(np.zeros((), np.float32), name="f_off")
        with pytest.raises(TypeError, match="f_off.*float32"):
            ops.remote_load(buf, f_off)
        v_off = popxl.variable(np.zeros((2,), np.int32), name="v_off")
        with pytest.raises(TypeError, match="v_off"):
            ops.remote_load(buf, v_off)
        with pytest.raises(TypeError, match="offset"):
            ops.remote_load(buf, 1.0)
        with pytest.raises(TypeError, match="RemoteBuffer"):
            ops.remote_load("buf", 0)
        with pytest.raises(ValueError, match="another Ir"):
            ops.remote_load(foreign, 0)


# --- remote_load / remote_store: runtime ---------------------------------------------------
@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32, np.uint32])
def test_store_load_round_trip_per_replica(workers, R, dt):
    """Per run: a = load(buf, i); store(buf, j, x); b = load(buf, j); store(buf, 2, a);
    c = load(buf, 2); i, j streamed per replica. Each replica only sees its own copy."""
    E, shape = 3, (2, 3)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream(shape, popxl.dtype.as_dtype(dt), "x")
        i_s = popxl.h2d_stream((), popxl.uint32, "i")
        j_s = popxl.h2d_stream((), popxl.int32, "j")
        buf = popxl.remote_buffer(shape, popxl.dtype.as_dtype(dt), E)
        with popxl.in_sequence():
            x = ops.host_load(xs, "x")
            i = ops.host_load(i_s, "i")
            j = ops.host_load(j_s, "j")
            a = ops.remote_load(buf, i, "a")
            ops.remote_store(buf, j, x)
            b = ops.remote_load(buf, j, "b")
            ops.remote_store(buf, 2, a)
            c = ops.remote_load(buf, 2, "c")
        outs = {n: store_out(t, n) for n, t in (("a", a), ("b", b), ("c", c))}
    rng = np.random.default_rng(R)
    mem = np.zeros((R, E) + shape, dt)                   # entries not written start at zero
    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(4):
            x_v = rng.integers(0, 50, (R,) + shape).astype(dt)
            i_v = rng.integers(0, E, R).astype(np.uint32)
            j_v = rng.integers(0, 2, R).astype(np.int32)
            got = sess.run({xs: x_v, i_s: i_v, j_s: j_v})
            for r in range(R):
                want_a = mem[r, i_v[r]].copy()
                mem[r, j_v[r]] = x_v[r]
                want_b = mem[r, j_v[r]].copy()
                mem[r, 2] = want_a
                for n, want in (("a", want_a), ("b", want_b), ("c", want_a)):
                    assert got[outs[n]].dtype == dt
                    np.testing.assert_array_equal(got[outs[n]][r], want, err_msg=f"{n} r{r}")


def test_out_of_range_tensor_offset(workers):
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        i_s = popxl.h2d_stream((), popxl.int32, "i")
        buf = popxl.remote_buffer((2,), popxl.float32, 3)
        store_out(ops.remote_load(buf, ops.host_load(i_s, "i")), "o")
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({i_s: np.array([0, 2], np.int32)})
        with pytest.raises(Exception, match="entry 3.*remote buffer 1.*3 entries"):
            sess.run({i_s: np.array([1, 3], np.int32)})


def test_remote_load_inplace_into_variable(workers):
    """remote_load_ fills an on-chip variable from the buffer; the change persists."""
    R = 2
    data = np.array([[1.5, -2.0, 3.0], [4.0, 5.0, -6.5]], np.float32)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        buf = popxl.remote_buffer((3,), popxl.float32, 2)
        rv = popxl.remote_variable(data, buf, 1, replica_grouping=ir.replica_grouping(1, 1),
                                   name="rv")
        w = popxl.variable(np.zeros(3, np.float32), name="w")
        y = ops.remote_load_(buf, 1, w)
        o = store_out(y * 2.0, "o")
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()
        np.testing.assert_array_equal(got[o], data * 2)
        np.testing.assert_array_equal(sess.get_tensor_data(w), data[0])
        np.testing.assert_array_equal(sess.get_tensor_data(rv), data)


# --- remote variables -----------------------------------------------------------------------
@pytest.mark.parametrize("R,grouping", [(2, None), (4, None), (4, (1, 2)), (4, (2, 2)),
                                        (4, (1, 1))])
@pytest.mark.parametrize("mode", ["one_per_group", "all_replicas"])
def test_remote_variable(workers, R, grouping, mode):
    """Program: x = load(buf, 1); y = x + d (d per replica); store(buf, 1, y); out x."""
    stride, size = grouping or (1, R)
    G = R // size
    shape = (2, 3)
    rng = np.random.default_rng(7)
    init = rng.normal(size=(G,) + shape).astype(np.float32)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(*grouping) if grouping else None
        ds = popxl.h2d_stream(shape, popxl.float32, "d")
        buf = popxl.remote_buffer(shape, popxl.float32, 2)
        v = popxl.remote_variable(init if G > 1 else init[0], buf, 1, name="v",
                                  replica_grouping=rg, retrieval_mode=mode)
        assert v.shape == shape
        with popxl.in_sequence():
            x = ops.remote_load(buf, 1, "x")
            ops.remote_store(buf, 1, x + ops.host_load(ds, "d"))
        o = store_out(x, "o")
    groups = [ref_group(r, stride, size) for r in range(R)]
    dev = init[groups].copy()                            # each replica's entry 1
    firsts = [ref_members(0, stride, size)[0]] if G == 1 else \
        [min(r for r in range(R) if groups[r] == g) for g in range(G)]

    def host_view():
        if mode == "all_replicas" and size > 1:
            return dev
        return dev[firsts] if G > 1 else dev[firsts[0]]

    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(2):
            d = rng.normal(size=(R,) + shape).astype(np.float32)
            got = sess.run({ds: d})
            np.testing.assert_allclose(got[o], dev, rtol=1e-6)
            dev = dev + d
            np.testing.assert_allclose(sess.get_tensor_data(v), host_view(), rtol=1e-6)
            assert sess.get_tensor_data(v).shape == tuple(v._retrieved_shape)   # all_replicas: R
        if mode == "one_per_group" or size == 1:
            # Written while attached: the device sees it on the next run.
            new = rng.normal(size=v.shape_on_host).astype(np.float32)
            sess.write_variable_data(v, new)
            dev = np.stack([new[groups[r]] if G > 1 else new for r in range(R)])
            d = np.zeros((R,) + shape, np.float32)
            np.testing.assert_allclose(sess.run({ds: d})[o], dev, rtol=1e-6)
    np.testing.assert_allclose(sess.get_tensor_data(v), host_view(), rtol=1e-6)


def test_remote_ops_in_subgraphs(workers):
    """Two remote variables share a buffer (entry 1 untied, starts at zero). A called graph
    loads / updates the entry chosen per replica by a streamed offset; a repeat loop bumps
    entry 0 three times."""
    R = 4
    v0_data = np.array([1, 2, 3], np.float32)
    v2_data = np.array([[7, 8, 9], [4, 5, 6]], np.float32)          # grouping (2, 2)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        buf = popxl.remote_buffer((3,), popxl.float32, 3)
        v0 = popxl.remote_variable(v0_data, buf, 0, name="v0", retrieval_mode="all_replicas")
        v2 = popxl.remote_variable(v2_data, buf, 2, name="v2",
                                   replica_grouping=ir.replica_grouping(2, 2))
        i_s = popxl.h2d_stream((), popxl.int32, "i")
        d_s = popxl.h2d_stream((3,), popxl.float32, "d")

        def update(i, d):
            with popxl.in_sequence():
                x = ops.remote_load(buf, i, "x")
                ops.remote_store(buf, i, x + d)
            return x

        def bump():
            ops.remote_store(buf, 0, ops.remote_load(buf, 0) + 1.0)

        g = ir.create_graph(update, popxl.TensorSpec((), popxl.int32),
                            popxl.TensorSpec((3,), popxl.float32))
        with popxl.in_sequence():
            x, = ops.call(g, ops.host_load(i_s, "i"), ops.host_load(d_s, "d"))
            ops.repeat(ir.create_graph(bump), 3)
            e1 = ops.remote_load(buf, 1, "e1")
        o_x, o_e1 = store_out(x, "x"), store_out(e1, "e1")
    mem = np.zeros((R, 3, 3), np.float32)
    mem[:, 0] = v0_data
    mem[:, 2] = v2_data[[ref_group(r, 2, 2) for r in range(R)]]
    rng = np.random.default_rng(3)
    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(2):
            i = rng.integers(0, 3, R).astype(np.int32)
            d = rng.normal(size=(R, 3)).astype(np.float32)
            got = sess.run({i_s: i, d_s: d})
            for r in range(R):
                np.testing.assert_allclose(got[o_x][r], mem[r, i[r]], rtol=1e-6)
                mem[r, i[r]] += d[r]
            mem[:, 0] += 3
            np.testing.assert_allclose(got[o_e1], mem[:, 1], rtol=1e-6)
            np.testing.assert_allclose(sess.get_tensor_data(v0), mem[:, 0], rtol=1e-6)
            np.testing.assert_allclose(sess.get_tensor_data(v2), mem[[0, 1], 2], rtol=1e-6)


def test_remote_replica_sharded_variable_plain_buffer(workers):
    """A plain RemoteBuffer of 1-D shards: the variable sets its meta_shape and the shard count
    is the group size (3 elements over 4 replicas: shards of 1, the last one padding)."""
    R = 4
    data = np.array([[5, -1, 2]], np.float32)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        buf = popxl.remote_buffer((1,), popxl.float32, 1)
        v = popxl.remote_replica_sharded_variable(data, buf, 0, name="v")
        assert buf.meta_shape == (1, 3) and v.shape == (1, 3)
        shard = ops.remote_load(buf, 0, "s")
        assert shard.meta_shape == (1, 3)
        o_shard = store_out(shard, "shard")
        o_full = store_out(C.replicated_all_gather(shard), "full")
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()
    np.testing.assert_array_equal(got[o_shard], [[5], [-1], [2], [0]])
    np.testing.assert_array_equal(got[o_full], np.repeat(data[None], R, 0))


def test_remote_variable_errors():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        buf = popxl.remote_buffer((3,), popxl.float32, 2)
        with pytest.raises(ValueError, match="offset"):
            popxl.remote_variable(np.zeros(3, np.float32), buf, 2)
        with pytest.raises(ValueError, match="group axis"):
            popxl.remote_variable(np.zeros(3, np.float32), buf,
                                  replica_grouping=ir.replica_grouping(1, 2))
        v = popxl.remote_variable(np.zeros(3, np.float32), buf, name="v")
        ops.add(v, v)                                    # read directly, not via remote_load
    with pytest.raises(ValueError, match="remote_load"):
        popxl.Session(ir, "ipu_hw")


@pytest.mark.parametrize("data,match", [
    (np.zeros(4, np.float32), r"'v' of per-group shape \(4,\) \(4 elements\).*remote buffer 1"),
    (np.zeros(3, np.int32), r"'v' of dtype int32 does not fit remote buffer 1"),
])
def test_remote_variable_that_does_not_fit_its_buffer_is_refused_by_the_session(data, match):
    """As upstream, creation checks nothing; the Session refuses what cannot be stored."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        buf = popxl.remote_buffer((3,), popxl.float32)
        v = popxl.remote_variable(data, buf, name="v")
        assert v.shape == data.shape
    with pytest.raises(ValueError, match=match):
        popxl.Session(ir, "ipu_hw")


# --- RTS ------------------------------------------------------------------------------------
RTS_CASES = [  # (R, grouping or None, shard_over or None, per-group shape, dtype)
    (2, None, None, (2, 5), np.float32),
    (4, None, None, (10,), np.float32),                  # 10 over 4: padded to 12
    (4, None, None, (3,), np.float16),                   # fewer elements than shards
    (4, None, None, (5,), np.int32),                     # shards of 2, the last all padding
    (4, None, 2, (7,), np.float32),                      # shards repeat across blocks
    (8, None, 4, (6,), np.float32),
    (4, (1, 2), None, (5,), np.float32),                 # grouped: 2 groups of 2
    (4, (2, 2), None, (3, 3), np.float16),
    (8, (1, 4), 2, (5,), np.float32),                    # grouped and shard_over < group size
]


def rand(rng, shape, dt) -> np.ndarray:
    if np.dtype(dt).kind == "f":
        return rng.normal(size=shape).astype(dt)
    return rng.integers(-20, 20, size=shape).astype(dt)


@pytest.mark.parametrize("R,grouping,k,shape,dt", RTS_CASES)
def test_replica_sharded_variable(workers, R, grouping, k, shape, dt):
    """Each run: out the shard and the gathered value, then shard += d (d per replica)."""
    stride, size = grouping or (1, R)
    G = R // size
    k_eff = k or size
    rng = np.random.default_rng(R)
    init = rand(rng, (G,) + shape, dt)
    n = int(np.prod(shape))
    c = math.ceil(n / k_eff)
    tol = 1e-3 if dt == np.float16 else 1e-6
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(*grouping) if grouping else None
        v, shard = popxl.replica_sharded_variable(init if G > 1 else init[0], name="w",
                                                  replica_grouping=rg, shard_over=k)
        assert v.shape == shape and v.dtype == popxl.dtype.as_dtype(dt)
        assert shard.shape == (c,) and shard.meta_shape == shape
        assert shard.name == "w_rts_remote_loaded"
        ds = popxl.h2d_stream((c,), shard.dtype, "d")
        full = C.replicated_all_gather(shard, group=ir.replica_grouping(stride, k_eff))
        assert full.shape == shape
        o_shard = store_out(ops.identity(shard), "shard")
        o_full = store_out(full, "full")
        ops.add_(shard, ops.host_load(ds, "d"))           # in place: persists across runs
    groups = [ref_group(r, stride, size) for r in range(R)]
    index = [ref_members(r, stride, size).index(r) for r in range(R)]
    shards = np.stack([ref_chunk(init[groups[r]], index[r] % k_eff, k_eff) for r in range(R)])

    def gathered(r):
        mem = ref_members(r, stride, size)
        blk = index[r] // k_eff
        flat = np.concatenate([shards[m] for m in mem[blk * k_eff:(blk + 1) * k_eff]])
        return flat[:n].reshape(shape)

    def host_value():
        firsts = [min(q for q in range(R) if groups[q] == g) for g in range(G)]
        vals = np.stack([gathered(f) for f in firsts])
        return vals if G > 1 else vals[0]

    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(2):
            d = rand(rng, (R, c), dt)
            got = sess.run({ds: d})
            np.testing.assert_allclose(got[o_shard], shards, rtol=tol)
            for r in range(R):
                np.testing.assert_allclose(got[o_full][r], gathered(r), rtol=tol,
                                           err_msg=f"replica {r}")
            shards = shards + d
            np.testing.assert_allclose(sess.get_tensor_data(v), host_value(), rtol=tol)
        new = rand(rng, v.shape_on_host, dt)
        sess.write_variable_data(v, new)
        new_g = new if G > 1 else new[None]
        shards = np.stack([ref_chunk(new_g[groups[r]], index[r] % k_eff, k_eff)
                           for r in range(R)])
        got = sess.run({ds: np.zeros((R, c), dt)})
        np.testing.assert_allclose(got[o_shard], shards, rtol=tol)
        for r in range(R):
            np.testing.assert_allclose(got[o_full][r], new_g[groups[r]], rtol=tol)
    np.testing.assert_allclose(sess.get_tensor_data(v), new, rtol=tol)


def test_rts_all_replicas_and_reattach(workers):
    """retrieval_mode all_replicas: each replica's block rebuilds its own full value; a second
    `with session:` pushes those host values back and the device continues from them."""
    R, k, n = 4, 2, 5
    data = np.arange(n, dtype=np.float32) + 1
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        v, shard = popxl.replica_sharded_variable(data, name="w", shard_over=k,
                                                  retrieval_mode="all_replicas")
        ds = popxl.h2d_stream((3,), popxl.float32, "d")
        ops.var_updates.accumulate_(shard, ops.host_load(ds, "d"))
        o = store_out(C.replicated_all_gather(shard, group=ir.replica_grouping(1, k)), "o")
    d = np.arange(R * 3, dtype=np.float32).reshape(R, 3) * 10
    shards = np.stack([ref_chunk(data, r % k, k) for r in range(R)]) + d
    want = np.stack([np.concatenate([shards[r - r % k], shards[r - r % k + 1]])[:n]
                     for r in range(R)])
    sess = popxl.Session(ir, "ipu_hw")
    with sess:
        sess.run({ds: d})
    np.testing.assert_array_equal(sess.get_tensor_data(v), want)
    with sess:
        got = sess.run({ds: np.zeros((R, 3), np.float32)})
    np.testing.assert_array_equal(got[o], want)


@pytest.mark.parametrize("R,grouping,k", [(2, None, None), (4, None, 2), (4, (2, 2), None)])
def test_remote_replica_sharded_variable(workers, R, grouping, k):
    """Explicit path: replica_sharded_buffer with 2 entries, the variable in entry 1, loaded,
    updated (+1) and stored back by the program; the host reads the buffer."""
    stride, size = grouping or (1, R)
    G = R // size
    k_eff = k or size
    shape = (2, 5)
    n, c = 10, math.ceil(10 / k_eff)
    init = np.arange(G * n, dtype=np.float32).reshape((G,) + shape) - 3
    host_shape = (G,) + shape if G > 1 else shape
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(*grouping) if grouping else None
        buf = popxl.replica_sharded_buffer(host_shape, popxl.float32, rg, k, entries=2)
        assert buf.tensor_shape == (c,) and buf.meta_shape == shape and buf.entries == 2
        v = popxl.remote_replica_sharded_variable(init if G > 1 else init[0], buf, 1,
                                                  name="v", replica_grouping=rg)
        assert v.shape == shape and v.meta_shape == shape
        with popxl.in_sequence():
            shard = ops.remote_load(buf, 1, "s")
            assert shard.shape == (c,) and shard.meta_shape == shape
            full = C.replicated_all_gather(shard, group=ir.replica_grouping(stride, k_eff))
            ops.remote_store(buf, 1, shard + 1.0)
        o_full = store_out(full, "full")
    groups = [ref_group(r, stride, size) for r in range(R)]
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(2):
            got = sess.run()
            for r in range(R):
                # Padding elements are +1 too but are dropped by the gather.
                np.testing.assert_array_equal(got[o_full][r], init[groups[r]] + step)
        np.testing.assert_array_equal(sess.get_tensor_data(v), (init + 2).reshape(host_shape))


def test_rts_errors():
    ir1 = popxl.Ir()
    with ir1.main_graph:
        with pytest.raises(ValueError, match="replication"):
            popxl.replica_sharded_variable(np.zeros(4, np.float32))
        buf = popxl.remote_buffer((2,), popxl.float32)
        with pytest.raises(ValueError, match="replication"):
            popxl.remote_replica_sharded_variable(np.zeros(4, np.float32), buf)
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_variable(np.zeros(4, np.float32), shard_over=3)
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_variable(np.zeros(4, np.float32), shard_over=8)
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_buffer((4,), popxl.float32, ir.replica_grouping(1, 2), 4)
        buf = popxl.replica_sharded_buffer((2, 5), popxl.float32)
        assert buf.tensor_shape == (3,) and buf.meta_shape == (2, 5)
        with pytest.raises(ValueError, match=r"\(5, 2\).*meta_shape"):
            popxl.remote_replica_sharded_variable(np.zeros((5, 2), np.float32), buf)
        with pytest.raises(ValueError, match="group axis"):
            popxl.replica_sharded_variable(np.zeros(4, np.float32),
                                           replica_grouping=ir.replica_grouping(1, 2))
        with pytest.raises(ValueError, match="main graph"):
            g = ir.create_empty_graph("sub")
            with g:
                popxl.replica_sharded_variable(np.zeros(4, np.float32))


@pytest.mark.parametrize("data,buffer_shape,match", [
    (np.zeros((2, 5), np.float16), None, "'w' of dtype float16 does not fit"),
    (np.zeros((5, 3, 7, 7), np.float32), (3, 7, 7), r"'w' of per-group shape \(5, 3, 7, 7\)"),
])
def test_rts_variable_that_does_not_fit_its_buffer_is_refused_by_the_session(
        data, buffer_shape, match):
    """As upstream, creation only checks the buffer's meta_shape; the Session refuses a dtype
    or shard size the buffer entry cannot hold."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        if buffer_shape is None:
            buf = popxl.replica_sharded_buffer((2, 5), popxl.float32)
        else:
            buf = popxl.remote_buffer(buffer_shape, popxl.float32)
        v = popxl.remote_replica_sharded_variable(data, buf, name="w")
        assert v.shape == data.shape
    with pytest.raises(ValueError, match=match):
        popxl.Session(ir, "ipu_hw")


def test_remote_variables_in_buffers_of_another_shape(workers):
    """A buffer entry holds the variable's elements: `(1, 1)` int32 data in a `(1,)` buffer
    (one group) or `(G, 1)` data with G groups, and an RTS variable whose 1-D shards live in a
    2-D buffer: loads give the buffer's shape, the host keeps the variable's."""
    R = 4
    ir = popxl.Ir(replication=R)
    groupings = [(1, 4), (1, 2), (2, 2), (1, 1)]
    outs = []
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    with ir.main_graph, popxl.in_sequence():
        variables = []
        for stride, size in groupings:
            rg = ir.replica_grouping(stride, size)
            data = np.arange(rg.num_groups, dtype=np.int32)[:, None]     # (G, 1)
            buf = popxl.remote_buffer((1,), popxl.int32, 1)
            variables.append(popxl.remote_variable(data, buf, replica_grouping=rg))
            loaded = ops.remote_load(buf, 0)
            assert loaded.shape == (1,)
            outs.append(store_out(loaded, f"g{stride}_{size}"))
            ops.remote_store(buf, 0, loaded + 10)
        rts_buf = popxl.remote_buffer((2, 3), popxl.float32, 1)
        rts = popxl.remote_replica_sharded_variable(full, rts_buf, name="rts")
        shard = ops.remote_load(rts_buf, 0)
        assert shard.shape == (2, 3) and shard.meta_shape == (4, 6)
        outs.append(store_out(shard, "shard"))
        ops.remote_store(rts_buf, 0, shard * 2)
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()
        for (stride, size), o in zip(groupings, outs):
            np.testing.assert_array_equal(
                got[o].reshape(R), [ref_group(r, stride, size) for r in range(R)])
        np.testing.assert_array_equal(got[outs[-1]], full.reshape(R, 2, 3))
    for (stride, size), v in zip(groupings, variables):
        G = R // size
        assert v.shape == ((1, 1) if G == 1 else (1,))
        np.testing.assert_array_equal(sess.get_tensor_data(v),
                                      (np.arange(G)[:, None] + 10).reshape(v.shape_on_host))
    np.testing.assert_array_equal(sess.get_tensor_data(rts), full * 2)
    sess.write_variable_data(rts, -full)
    sess.write_variable_data(variables[0], np.array([[7]], np.int32))
    with sess:
        got = sess.run()
    np.testing.assert_array_equal(got[outs[-1]], -full.reshape(R, 2, 3))
    np.testing.assert_array_equal(got[outs[0]].reshape(R), [7] * R)


@pytest.mark.parametrize("n,k", [(10, 4), (12, 2), (7, 1)])
def test_device_memory_report(workers, n, k):
    """An RTS variable of n float32 costs ceil(n/k)*4 bytes of shards per replica; the same
    variable unsharded costs n*4 bytes of on-chip variables."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        data = np.arange(n, dtype=np.float32)
        if k > 1:
            _, shard = popxl.replica_sharded_variable(data, name="w", shard_over=k)
            store_out(shard, "o")
        else:
            w = popxl.variable(data, name="w")
            store_out(w, "o")
    with popxl.Session(ir, "ipu_hw") as sess:
        report = sess.device_memory_report()
    assert len(report) == (1 if workers is None else int(workers))
    for entry in report:
        if k > 1:
            assert entry["rts_shards"] == math.ceil(n / k) * 4
            assert entry["variables"] == 0
        else:
            assert entry["variables"] == n * 4
            assert entry["rts_shards"] == 0
    with pytest.raises(ValueError, match="attached"):
        sess.device_memory_report()


def test_validate_tensor_matches_buffer_uses_upstreams_wording():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3), np.float32), name="t")
        popxl.remote_buffer((2, 3), popxl.float32, 1).validate_tensor_matches_buffer(t)
        for shape, dtype in (((1, 3, 5), popxl.float32), ((2, 3), popxl.int16)):
            buf = popxl.remote_buffer(shape, dtype, 1)
            with pytest.raises(ValueError, match=r"^Tensor t does not match buffer\.\nExisting "
                                                 r"remote buffer \d+ has shape=.* and dtype=\w+\."
                                                 r"\nThe tensor has shape=\(2, 3\), "
                                                 r"dtype=float32\.$"):
                buf.validate_tensor_matches_buffer(t)
