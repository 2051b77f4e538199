"""Neighbouring all-reduces run as one exchange after each is moved as early as its inputs allow:
the values are NumPy's reductions, the bits those of unbatched all-reduces, and an all-reduce
never passes an op that writes the memory it reads."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

R = 4


def _program(dtypes=(np.float32,) * 4):
    """Per-variable gradient all-reduces, each followed by that variable's update (as a
    data-parallel step is written); one gradient is changed in place before its all-reduce."""
    rng = np.random.default_rng(3)
    ir = popxl.Ir(replication=R)
    shapes = [(3, 5), (7,), (2, 2, 2), (11, 3)][:len(dtypes)]
    with ir.main_graph:
        xs = popxl.h2d_stream((len(shapes), 4), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        ws = [popxl.variable(rng.normal(size=s).astype(dt), name=f"w{i}")
              for i, (s, dt) in enumerate(zip(shapes, dtypes))]
        grads = [ops.cast(ops.sum(x[i]), w.dtype) * w for i, w in enumerate(ws)]
        ops.scaled_add_(grads[1], grads[1], a=2.0, b=1.0)       # in place, before its reduce
        stores = []
        for i, (w, g) in enumerate(zip(ws, grads)):
            g = ops.collectives.replicated_all_reduce(g.reshape((-1,)), op="mean")
            ops.scaled_add_(w, g.reshape(w.shape), b=-0.5)
            s = popxl.d2h_stream(w.shape, w.dtype, f"g{i}")
            ops.host_store(s, g.reshape(w.shape))
            stores.append(s)
    data = rng.normal(size=(R, len(shapes), 4)).astype(np.float32)
    return ir, xs, ws, stores, data


def _run(monkeypatch, batch: str, dtypes=(np.float32,) * 4):
    monkeypatch.setenv("POPXL_BATCH_COLLECTIVES", batch)
    ir, xs, ws, stores, data = _program(dtypes)
    with popxl.Session(ir, "ipu_hw") as sess:
        w0 = [sess.get_tensor_data(w).copy() for w in ws]
        out = sess.run({xs: data})
        src = sess._runtime.worker.program.main.source
        return [out[s] for s in stores], [sess.get_tensor_data(w) for w in ws], w0, data, src


def test_batched_all_reduces_are_numpys_mean(monkeypatch):
    got, new_w, w0, data, src = _run(monkeypatch, "1")
    assert sum("yield" in line for line in src.splitlines()) == 1, src
    for i, (g, w) in enumerate(zip(got, w0)):
        per_replica = [np.float32(data[r, i].sum()) * w for r in range(R)]
        if i == 1:
            per_replica = [p * np.float32(2) + p for p in per_replica]
        want = per_replica[0]
        for p in per_replica[1:]:
            want = want + p
        want = want / np.float32(R)
        for r in range(R):
            np.testing.assert_allclose(g[r], want, rtol=1e-5)
        np.testing.assert_allclose(new_w[i], w - np.float32(0.5) * want, rtol=1e-5)


@pytest.mark.parametrize("dtypes", [(np.float32,) * 4,
                                    (np.float32, np.float16, np.float16, np.float32)])
def test_batching_keeps_the_bits(monkeypatch, dtypes):
    on = _run(monkeypatch, "1", dtypes)
    off = _run(monkeypatch, "0", dtypes)
    assert sum("yield" in line for line in off[4].splitlines()) == len(dtypes)
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_an_all_reduce_does_not_pass_a_write_to_its_input(monkeypatch):
    """x is updated in place between two all-reduces; the second reduces the updated x."""
    monkeypatch.setenv("POPXL_BATCH_COLLECTIVES", "1")
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        x = popxl.variable(np.arange(6, dtype=np.float32), name="x")
        y = popxl.variable(np.ones(6, np.float32), name="y")
        a = ops.collectives.replicated_all_reduce(y, op="add")
        ops.scaled_add_(x, a, b=1.0)                               # x += 4 * y
        v = x.reshape((2, 3))                                      # a view of x
        b = ops.collectives.replicated_all_reduce(v, op="add")
        s = popxl.d2h_stream((2, 3), popxl.float32, "b")
        ops.host_store(s, b)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()[s]
        src = sess._runtime.worker.program.main.source
    assert sum("yield" in line for line in src.splitlines()) == 2, src
    want = R * (np.arange(6, dtype=np.float32) + R).reshape(2, 3)
    np.testing.assert_array_equal(out.reshape(R, 2, 3), np.tile(want, (R, 1, 1)))


def _gather_scatter_program():
    """Neighbouring all-gathers (of shards of several shapes, one along axis 1) and
    reduce-scatters (lengths that need padding), as replica-sharded weights and grads give."""
    rng = np.random.default_rng(5)
    ir = popxl.Ir(replication=R)
    shapes = [(3, 2), (5,), (2, 3)]
    with ir.main_graph:
        xs = popxl.h2d_stream((10,), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        ws = [popxl.variable(rng.normal(size=s).astype(np.float32), name=f"w{i}")
              for i, s in enumerate(shapes)]
        local = [w * ops.sum(x) for w in ws]
        gathered = [ops.collectives.replicated_all_gather(t, axis=a)
                    for t, a in zip(local, (0, 0, 1))]
        scattered = [ops.collectives.replicated_reduce_scatter(t, op="add") for t in local]
        stores = []
        for i, t in enumerate(gathered + scattered):
            s = popxl.d2h_stream(t.shape, t.dtype, f"o{i}")
            ops.host_store(s, t)
            stores.append(s)
    data = rng.normal(size=(R, 10)).astype(np.float32)
    return ir, xs, ws, stores, data


def test_batched_gathers_and_scatters(monkeypatch):
    results = {}
    for batch in ("1", "0"):
        monkeypatch.setenv("POPXL_BATCH_COLLECTIVES", batch)
        ir, xs, ws, stores, data = _gather_scatter_program()
        with popxl.Session(ir, "ipu_hw") as sess:
            w = [sess.get_tensor_data(v) for v in ws]
            out = sess.run({xs: data})
            src = sess._runtime.worker.program.main.source
        results[batch] = [out[s] for s in stores]
        assert sum("yield" in line for line in src.splitlines()) == (2 if batch == "1" else 6)
    for a, b in zip(results["1"], results["0"]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    local = [[wi * np.float32(data[r].sum()) for wi in w] for r in range(R)]
    for i, axis in enumerate((0, 0, 1)):                     # gathers, members in order
        want = np.concatenate([local[r][i] for r in range(R)], axis=axis)
        for r in range(R):
            np.testing.assert_array_equal(results["1"][i][r], want)
    for i in range(3):                                       # reduce-scatters: member r's chunk
        total = sum(local[r][i].reshape(-1).astype(np.float64) for r in range(R))
        c = -(-total.size // R)
        padded = np.zeros(c * R)
        padded[:total.size] = total
        for r in range(R):
            np.testing.assert_allclose(results["1"][3 + i][r], padded[r * c:(r + 1) * c],
                                       rtol=1e-5, atol=1e-6)
