"""Replication semantics: host layout `(num_host_transfers, R, *shape)` (size-1 axes dropped),
replicated and grouped variables, retrieval modes and `Ir(replication=...)`.

Every Session test runs on three in-process worker layouts (one worker; 2 and 3 worker threads)
and expects the same results. References are NumPy loops written here.
"""
import re

import numpy as np
import popxl
import pytest
from popxl import ops

SHAPE = (2, 3)
W0 = np.array([[1, 2, 3], [-1, 0, 2]], np.float32)


@pytest.fixture(params=[None, "2", "3"], ids=["1worker", "2workers", "3workers"])
def workers(request, monkeypatch):
    """Worker layout of the local backend (read when the Session is created)."""
    monkeypatch.setenv("POPXL_BACKEND", "local")
    if request.param is None:
        monkeypatch.delenv("POPXL_WORKERS", raising=False)
    else:
        monkeypatch.setenv("POPXL_WORKERS", request.param)
    return request.param


def _host_shape(T: int, R: int, shape) -> tuple:
    return tuple(d for d in (T, R) if d > 1) + tuple(shape)


def _ref_group(r: int, stride: int, group_size: int) -> int:
    return r % stride + stride * (r // (stride * group_size))


# --- host layout, transfers and replica-specific state ------------------------------------

def _build(R: int, T: int, mode: str):
    """Per transfer: x = load; y = x * w + 1; store y; s += y; w += x."""
    ir = popxl.Ir(replication=R)
    ir.num_host_transfers = T
    with ir.main_graph:
        x_s = popxl.h2d_stream(SHAPE, popxl.float32, "x")
        popxl.h2d_stream(SHAPE, popxl.float32, "unused")      # never loaded: not expected
        y_s = popxl.d2h_stream(SHAPE, popxl.float32, "y")
        w = popxl.variable(W0, name="w")
        s = popxl.variable(np.zeros(SHAPE, np.float32), name="s", retrieval_mode="all_replicas")

        def step(w_, s_):
            with popxl.in_sequence():
                x = ops.host_load(x_s, "x")
                y = x * w_ + 1.0
                ops.host_store(y_s, y)
                ops.var_updates.accumulate_(s_, y)
                ops.var_updates.accumulate_(w_, x)

        if mode == "repeat":
            def body(w_: popxl.TensorByRef, s_: popxl.TensorByRef):
                step(w_, s_)

            ops.repeat(ir.create_graph(body, w, s), T, w, s)
        else:
            for _ in range(T):
                step(w, s)
    return ir, x_s, y_s, w, s


def _reference(xs, R):
    """Outputs per run (each `(T, R, *SHAPE)`) and the final per-replica w and s."""
    w = np.repeat(W0[None], R, axis=0)
    s = np.zeros((R,) + SHAPE, np.float32)
    ys = []
    for x in xs:
        y = np.empty_like(x)
        for t in range(x.shape[0]):
            y[t] = x[t] * w + 1
            s += y[t]
            w += x[t]
        ys.append(y)
    return ys, w, s


@pytest.mark.parametrize("R", [1, 2, 4, 8])
@pytest.mark.parametrize("T,mode", [(1, "single"), (3, "repeat"), (3, "unrolled")])
def test_replica_specific_program(workers, R, T, mode):
    ir, x_s, y_s, w, s = _build(R, T, mode)
    rng = np.random.default_rng(R * 10 + T)
    xs = [rng.integers(-3, 4, (T, R) + SHAPE).astype(np.float32) for _ in range(2)]
    ys, w_ref, s_ref = _reference(xs, R)
    full = _host_shape(T, R, SHAPE)

    assert ir.replication_factor == ir.instance_replication_factor == R
    sess = popxl.Session(ir, "ipu_hw")
    assert sess.expected_inputs() == {x_s}
    assert sess._full_input_shape(SHAPE) == full
    assert sess._full_input_shape((5,)) == full[:-2] + (5,)
    host_out = sess.create_host_outputs()
    assert list(host_out) == [y_s]
    assert host_out[y_s].shape == full and host_out[y_s].dtype == np.float32
    # Before any run every replica holds the initial value.
    np.testing.assert_array_equal(sess.get_tensor_data(w), W0)
    s_host = sess.get_tensor_data(s)
    assert s_host.shape == ((R,) + SHAPE if R > 1 else SHAPE)
    np.testing.assert_array_equal(s_host, 0)

    with sess:
        out = sess.run({x_s: xs[0].reshape(full)})
        assert out[y_s].shape == full
        np.testing.assert_array_equal(out[y_s].reshape((T, R) + SHAPE), ys[0])
        # Second run: state carried over, stream pointers reset; caller-owned outputs.
        outputs = sess.create_host_outputs()
        outputs[y_s][...] = np.nan
        assert sess.run_with_outputs({x_s: xs[1].reshape(full)}, outputs) is None
        np.testing.assert_array_equal(outputs[y_s].reshape((T, R) + SHAPE), ys[1])

        # one_per_group: the first replica's value; all_replicas: every replica (R, *shape).
        np.testing.assert_array_equal(sess.get_tensor_data(w), w_ref[0])
        got_s = sess.get_tensor_data(s)
        assert got_s.shape == ((R,) + SHAPE if R > 1 else SHAPE)
        np.testing.assert_array_equal(got_s, s_ref if R > 1 else s_ref[0])
    if R > 1:   # the replicas diverged: nothing keeps them in sync
        assert any(not np.array_equal(s_ref[0], s_ref[r]) for r in range(1, R))

    # Leaving and re-entering the session goes through the host copy: every replica of the
    # one_per_group `w` restarts from replica 0's value, the all_replicas `s` keeps its own.
    x3 = np.ones((T, R) + SHAPE, np.float32)
    w3, s3 = np.repeat(w_ref[:1], R, axis=0), s_ref.copy()
    with sess:
        out = sess.run({x_s: x3.reshape(full)})
        for t in range(T):
            np.testing.assert_array_equal(out[y_s].reshape((T, R) + SHAPE)[t], x3[t] * w3 + 1)
            s3 += x3[t] * w3 + 1
            w3 += x3[t]
        got_s = sess.get_tensor_data(s)
    np.testing.assert_array_equal(got_s, s3 if R > 1 else s3[0])


@pytest.mark.parametrize("R,T", [(1, 1), (2, 1), (1, 3), (4, 3)])
def test_wrong_input_and_output_shapes_name_the_stream(R, T):
    ir, x_s, y_s, *_ = _build(R, T, "repeat" if T > 1 else "single")
    full = _host_shape(T, R, SHAPE)
    bad_inputs = [np.zeros(full[:-1] + (4,), np.float32), np.zeros((7,) + full, np.float32)]
    if full != SHAPE:
        bad_inputs.append(np.zeros(full[1:], np.float32))       # a leading axis missing
    if T > 1:
        bad_inputs.append(np.zeros((T - 1,) + full[1:], np.float32))   # too few transfers
    with popxl.Session(ir, "cpu") as sess:
        for bad in bad_inputs:
            msg = f"'x' expects an array of shape {re.escape(str(full))}"
            with pytest.raises(ValueError, match=msg):
                sess.run({x_s: bad})
        outputs = {y_s: np.zeros(full[:-1] + (4,), np.float32)}
        with pytest.raises(ValueError, match="output stream 'y'"):
            sess.run_with_outputs({x_s: np.zeros(full, np.float32)}, outputs)


def test_transfers_wrap_around_and_extra_input_transfers(workers):
    """k-th load reads transfer k % T of the input array; k-th store writes k % N."""
    R, N, loops = 2, 2, 4
    ir = popxl.Ir(replication=R)
    ir.num_host_transfers = N
    with ir.main_graph:
        x_s = popxl.h2d_stream((3,), popxl.float32, "x")
        y_s = popxl.d2h_stream((3,), popxl.float32, "y")
        acc = popxl.variable(np.zeros(3, np.float32), name="acc")

        def body(a: popxl.TensorByRef):
            with popxl.in_sequence():
                ops.var_updates.accumulate_(a, ops.host_load(x_s, "x"))
                ops.host_store(y_s, a + 0.0)

        ops.repeat(ir.create_graph(body, acc), loops, acc)
    rng = np.random.default_rng(0)
    with popxl.Session(ir, "cpu") as sess:
        for T in (N, 4):     # an input may carry more transfers than num_host_transfers
            x = rng.integers(0, 5, (T, R, 3)).astype(np.float32)
            a = np.zeros((R, 3), np.float32)
            want = np.empty((N, R, 3), np.float32)
            for k in range(loops):
                a = a + x[k % T]
                want[k % N] = a
            sess.write_variable_data(acc, np.zeros(3, np.float32))
            out = sess.run({x_s: x})
            np.testing.assert_array_equal(out[y_s], want)


def test_size_one_streams_may_be_passed_squeezed(workers):
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x_s = popxl.h2d_stream((1,), popxl.int32, "x")
        y_s = popxl.d2h_stream((1,), popxl.int32, "y")
        ops.host_store(y_s, ops.host_load(x_s) * 3)
    with popxl.Session(ir, "cpu") as sess:
        assert sess._full_input_shape((1,)) == (4, 1)
        out = sess.run({x_s: np.arange(4, dtype=np.int32)})
    assert out[y_s].shape == (4, 1)
    np.testing.assert_array_equal(out[y_s][:, 0], np.arange(4) * 3)


def test_replicated_variable_starts_equal_then_diverges(workers):
    R = 4
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        x_s = popxl.h2d_stream(SHAPE, popxl.float32, "x")
        w_s = popxl.d2h_stream(SHAPE, popxl.float32, "w_out")
        w = popxl.variable(W0, name="w")
        w_all = popxl.variable(W0, name="w_all", retrieval_mode="all_replicas")
        with popxl.in_sequence():
            x = ops.host_load(x_s)
            ops.host_store(w_s, w + 0.0)
            ops.var_updates.accumulate_(w, x)
            ops.var_updates.accumulate_(w_all, x)
    assert w.replica_grouping == ir.replica_grouping()
    assert (w.retrieval_mode, w_all.retrieval_mode) == ("one_per_group", "all_replicas")
    # shape_on_host is upstream's (one group: the shape); all_replicas reads return every replica
    assert (w.shape_on_host, w_all.shape_on_host, w.shape_on_replica) == (SHAPE, SHAPE, SHAPE)
    assert w_all._retrieved_shape == (R,) + SHAPE
    x = np.arange(R)[:, None, None] * np.ones(SHAPE, np.float32)   # replica r adds r
    with popxl.Session(ir, "cpu") as sess:
        out = sess.run({x_s: x})
        np.testing.assert_array_equal(out[w_s], np.repeat(W0[None], R, axis=0))
        out = sess.run({x_s: x})
        np.testing.assert_array_equal(out[w_s], W0 + x)      # diverged after one update
        np.testing.assert_array_equal(sess.get_tensor_data(w), W0 + 2 * x[0])
        np.testing.assert_array_equal(sess.get_tensor_data(w_all), W0 + 2 * x)
        with pytest.raises(NotImplementedError, match="'w_all'.*all_replicas"):
            sess.write_variable_data(w_all, np.zeros((R,) + SHAPE, np.float32))
        # Writing a replicated variable sets every replica again.
        sess.write_variable_data(w, np.full(SHAPE, 5, np.float32))
        out = sess.run({x_s: x})
        np.testing.assert_array_equal(out[w_s], 5)


# --- grouped variables ---------------------------------------------------------------------

GROUPINGS = [
    (4, (1, 2)), (4, (2, 2)), (4, (1, 1)),
    (8, (4, 2)), (8, (2, 4)), (8, (1, 4)),
    (4, [0, 1, 1, 0]),                              # not constant-stride
    (8, [0, 0, 1, 1, 0, 0, 1, 1]),                  # 2-D tensor parallel (const_rg: 4 groups)
]


def _grouping(ir, spec):
    if isinstance(spec, list):
        return ir.replica_grouping_from_assignments(spec)
    return ir.replica_grouping(*spec)


def _ref_assignment(R, spec):
    if isinstance(spec, list):
        return np.array(spec)
    return np.array([_ref_group(r, *spec) for r in range(R)])


@pytest.mark.parametrize("R,spec", GROUPINGS, ids=[f"R{r}-{s}" for r, s in GROUPINGS])
def test_grouped_variables(workers, R, spec):
    assign = _ref_assignment(R, spec)
    G = assign.max() + 1
    first = np.array([np.flatnonzero(assign == g)[0] for g in range(G)])  # first member of g
    data = (np.arange(G)[:, None] * 10 + np.arange(3)).astype(np.float32)

    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = _grouping(ir, spec)
        x_s = popxl.h2d_stream((3,), popxl.float32, "x")
        v_s = popxl.d2h_stream((3,), popxl.float32, "v_out")
        va_s = popxl.d2h_stream((3,), popxl.float32, "va_out")
        v = popxl.variable(data, replica_grouping=rg, name="v")
        va = popxl.variable(data, replica_grouping=rg, retrieval_mode="all_replicas", name="va")
        with popxl.in_sequence():
            x = ops.host_load(x_s)
            ops.host_store(v_s, v + 0.0)
            ops.host_store(va_s, va + 0.0)
            ops.var_updates.accumulate_(v, x)
            ops.var_updates.accumulate_(va, x)
    assert v.replica_grouping == rg and v.shape == (3,) and v.shape_on_replica == (3,)
    assert v.shape_on_host == ((G, 3) if G > 1 else (3,))
    assert va.shape_on_host == v.shape_on_host            # upstream's: per group, any mode

    sess = popxl.Session(ir, "cpu")
    assert sess.get_tensor_data(va).shape == ((R, 3) if rg.group_size > 1 else (G, 3))
    np.testing.assert_array_equal(sess.get_tensor_data(v), data)
    np.testing.assert_array_equal(sess.get_tensor_data(va), data[assign])   # R == G when k == 1

    rng = np.random.default_rng(R)
    xs = [rng.integers(-5, 6, (R, 3)).astype(np.float32) for _ in range(3)]
    with sess:
        out = sess.run({x_s: xs[0]})
        np.testing.assert_array_equal(out[v_s], data[assign])      # each replica: its group
        np.testing.assert_array_equal(out[va_s], data[assign])
        dev = data[assign] + xs[0]                                # per-replica device values
        got_v = sess.get_tensor_data(v)
        assert got_v.shape == (G, 3)
        np.testing.assert_array_equal(got_v, dev[first])           # first member of each group
        got_va = sess.get_tensor_data(va)
        assert got_va.shape == (R, 3)
        np.testing.assert_array_equal(got_va, dev)

        new = -data - 1
        sess.write_variable_data(v, new)
        out = sess.run({x_s: xs[1]})
        np.testing.assert_array_equal(out[v_s], new[assign])
        np.testing.assert_array_equal(out[va_s], dev)
        v_dev, va_dev = new[assign] + xs[1], dev + xs[1]

    # Out of the session the host copy is current; re-entering restores every replica.
    np.testing.assert_array_equal(sess.get_tensor_data(v), v_dev[first])
    np.testing.assert_array_equal(sess.get_tensor_data(va), va_dev)
    with sess:
        out = sess.run({x_s: xs[2]})
        np.testing.assert_array_equal(out[v_s], v_dev[first][assign])
        np.testing.assert_array_equal(out[va_s], va_dev)

    with pytest.raises(ValueError, match=rf"tensor v : \(3,\) \(its host data has shape \({G}, 3\)"):
        sess.write_variable_data(v, np.zeros(3, np.float32))
    if rg.group_size > 1:
        with pytest.raises(NotImplementedError, match="all_replicas"):
            sess.write_variable_data(va, np.zeros((R, 3), np.float32))


def test_grouped_variable_from_a_sequence_of_group_values(workers):
    R, G = 4, 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(stride=2, group_size=2)          # assignment [0, 1, 0, 1]
        per_group = [np.full((2, 2), g + 1, np.float32) for g in range(G)]
        v = popxl.variable(per_group, replica_grouping=rg, name="v")
        v_tuple = popxl.variable(tuple(per_group), replica_grouping=rg, name="v_tuple")
        v_s = popxl.d2h_stream((2, 2), popxl.float32, "v_out")
        ops.host_store(v_s, v + v_tuple)
    assert v.shape == (2, 2) and v.shape_on_host == (G, 2, 2)
    with popxl.Session(ir, "cpu") as sess:
        out = sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.stack(per_group))
    want = np.stack([2 * per_group[g] for g in (0, 1, 0, 1)])
    np.testing.assert_array_equal(out[v_s], want)


def test_grouped_variable_errors():
    ir = popxl.Ir(replication=4)
    other = popxl.Ir(replication=4)
    with ir.main_graph:
        rg = ir.replica_grouping(1, 2)                            # 2 groups
        with pytest.raises(ValueError, match="leading group axis of size 2"):
            popxl.variable(np.zeros(3, np.float32), replica_grouping=rg, name="a")
        with pytest.raises(ValueError, match=r"leading group axis of size 2.*\(3, 2\)"):
            popxl.variable(np.zeros((3, 2), np.float32), replica_grouping=rg, name="b")
        with pytest.raises(ValueError, match="another Ir"):
            popxl.variable(np.zeros((2, 3), np.float32), name="c",
                           replica_grouping=other.replica_grouping(1, 2))
        with pytest.raises(ValueError, match="retrieval_mode"):
            popxl.variable(np.zeros(3, np.float32), retrieval_mode="first_replica")
        # One group: no group axis, the data is the per-replica value.
        whole = popxl.variable(np.zeros(3, np.float32), replica_grouping=ir.replica_grouping())
    assert whole.shape == (3,) and whole.shape_on_host == (3,)


# --- replication factor and popdist ---------------------------------------------------------

def test_replication_factor_properties():
    assert popxl.Ir().replication_factor == 1
    ir = popxl.Ir(replication=4)
    assert (ir.replication_factor, ir.instance_replication_factor) == (4, 4)
    ir.replication_factor = 8
    assert (ir.replication_factor, ir.instance_replication_factor) == (8, 8)
    assert ir.replica_grouping().group_size == 8
    for bad in (0, -2, 1.5, "two", True):
        with pytest.raises(ValueError, match="replication_factor"):
            popxl.Ir(replication=bad)
    popxl.Session(ir, "cpu")
    with pytest.raises(RuntimeError, match="Session"):
        ir.replication_factor = 2
    assert ir.replication_factor == 8


def test_popdist_replication(monkeypatch, workers):
    monkeypatch.delenv("POPDIST_NUM_TOTAL_REPLICAS", raising=False)
    assert popxl.Ir(replication="popdist").replication_factor == 1
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "abc")
    with pytest.raises(ValueError, match="POPDIST_NUM_TOTAL_REPLICAS"):
        popxl.Ir(replication="popdist")
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    ir = popxl.Ir(replication="popdist")
    # The script is the single controller of every replica: one instance holds all of them.
    assert (ir.replication_factor, ir.instance_replication_factor) == (4, 4)
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_s, ops.host_load(x_s) + 1.0)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    with popxl.Session(ir, "cpu") as sess:
        assert sess._full_input_shape((2,)) == (4, 2)
        np.testing.assert_array_equal(sess.run({x_s: x})[y_s], x + 1)


def test_replication_set_in_the_session_options_is_the_irs():
    """As upstream, whose Ir keeps its replica count in its SessionOptions: setting
    enableReplicatedGraphs / replicatedGraphCount there sets replication_factor (until a
    Session prepares the Ir), and programs run with it."""
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    assert ir.replication_factor == 2
    with ir.main_graph:
        t = popxl.variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="t")
        g = ops.collectives.replicated_all_gather(t)
        out = popxl.d2h_stream(g.shape, g.dtype, "out")
        ops.host_store(out, g)
    assert g.shape == (4, 3)
    with popxl.Session(ir, "cpu") as sess:
        got = sess.run()[out]
    want = np.concatenate([np.arange(6, dtype=np.float32).reshape(2, 3)] * 2)
    np.testing.assert_array_equal(got, np.stack([want, want]))
    opts.replicatedGraphCount = 4                 # too late: the Session prepared the Ir
    assert ir.replication_factor == 2
