"""The memory plan of compiled graphs: buffers assigned by liveness (data that can be printed and
checked), no allocation in the steady state, and the same results as without a plan."""
import tracemalloc

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.engine.compile import Program

N = 64
BYTES = N * N * 4


def _chain_ir():
    """x @ W + W, GELU, @ W, * W: each value dies at the next op."""
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((N, N), popxl.float32, "x")
        x = ops.host_load(s, "x")
        w = popxl.variable(np.eye(N, dtype=np.float32) * 0.5, name="w")
        y = ops.gelu((x @ w) + w) @ w
        y = y * w
        o = popxl.d2h_stream((N, N), popxl.float32, "y")
        ops.host_store(o, y)
    return ir, s, o


def test_plan_is_data_buffers_reused_by_liveness_and_in_place():
    ir, _, _ = _chain_ir()
    plan = Program(ir._data).main.memory_plan
    # host_load's init (dies at the load) | matmul -> add (in place) -> gelu (in place) |
    # matmul (its input is alive: a second buffer) -> mul (in place)
    assert len(plan.assignment) == 6
    assert plan.num_buffers == 2
    assert plan.buffer_bytes == [BYTES, BYTES]
    assert plan.peak_bytes == 2 * BYTES
    assert plan.value_bytes == 6 * BYTES
    assert len(plan.in_place) == 3
    text = str(plan)
    assert "6 values in 2 buffers" in text and f"{2 * BYTES} bytes" in text


def _transformer_ir(dtype=popxl.float32):
    """A small pre-LN attention + MLP block with autodiff and an SGD update."""
    rng = np.random.default_rng(0)
    b, s, h = 4, 32, 64
    npd = dtype.as_numpy()
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((b * s, h), dtype, "x")
        ls = popxl.h2d_stream((b * s,), popxl.int32, "labels")
        x, labels = ops.host_load(xs, "x"), ops.host_load(ls, "labels")
        params = [popxl.variable((rng.normal(size=shape) * 0.2).astype(npd), dtype, name)
                  for name, shape in (("wqkv", (h, 3 * h)), ("wo", (h, h)), ("w1", (h, 4 * h)),
                                      ("w2", (4 * h, h)), ("g", (h,)), ("bt", (h,)))]

        def block(x, wqkv, wo, w1, w2, g, bt):
            z = ops.layer_norm(x, g, bt)
            q, k, v = ops.split(z @ wqkv, 3, axis=-1)
            q = q.reshape((b, s, 4, h // 4)).transpose((0, 2, 1, 3))
            k = k.reshape((b, s, 4, h // 4)).transpose((0, 2, 3, 1))
            v = v.reshape((b, s, 4, h // 4)).transpose((0, 2, 1, 3))
            a = ops.softmax((q @ k) * 0.25, -1) @ v
            x = x + a.transpose((0, 2, 1, 3)).reshape((b * s, h)) @ wo
            return x + ops.gelu(x @ w1) @ w2

        graph = ir.create_graph(block, x, *params)
        bwd = transforms.autodiff(graph, grads_required=graph.inputs[1:])
        info = ops.call_with_info(graph, x, *params)
        loss, dy = ops.nll_loss_with_softmax_grad(ops.softmax(info.outputs[0], -1), labels)
        grads = ops.call(bwd.graph, dy, inputs_dict=bwd.inputs_dict(info))
        for p, gp in zip(params, grads):
            ops.scaled_add_(p, gp, b=-0.1)
        o = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(o, ops.cast(loss, popxl.float32))
    data = [(rng.normal(size=(b * s, h)).astype(npd), rng.integers(0, h, b * s).astype(np.int32))
            for _ in range(3)]
    return ir, xs, ls, o, params, data


def _train(monkeypatch, plan_on: bool, dtype=popxl.float32):
    monkeypatch.setenv("POPXL_MEMORY_PLAN", "1" if plan_on else "0")
    ir, xs, ls, o, params, data = _transformer_ir(dtype)
    with popxl.Session(ir, "ipu_hw") as sess:
        losses = [sess.run({xs: x, ls: y})[o] for x, y in data]
        weights = sess.get_tensors_data(params)
        plans = [sess._runtime.worker.program.main.memory_plan] + [
            cg.memory_plan for cg in sess._runtime.worker.program._graphs.values()]
    return losses, [weights[p] for p in params], plans


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
def test_same_bits_with_and_without_the_plan(monkeypatch, dtype):
    on = _train(monkeypatch, True, dtype)
    off = _train(monkeypatch, False, dtype)
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert sum(p.num_buffers for p in on[2]) > 0
    assert sum(p.num_buffers for p in off[2]) == 0


def _steady_state_allocation(monkeypatch, plan_on: bool) -> int:
    """Peak bytes NumPy allocates during one run after two warm-up runs."""
    monkeypatch.setenv("POPXL_MEMORY_PLAN", "1" if plan_on else "0")
    ir, xs, ls, o, _, data = _transformer_ir()
    with popxl.Session(ir, "ipu_hw") as sess:
        for x, y in data[:2]:
            sess.run({xs: x, ls: y})
        tracemalloc.start()
        try:
            sess.run({xs: data[2][0], ls: data[2][1]})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return peak


def test_steady_state_allocates_almost_nothing(monkeypatch):
    with_plan = _steady_state_allocation(monkeypatch, True)
    without = _steady_state_allocation(monkeypatch, False)
    # Without the plan every intermediate is a new array; with it no value is allocated (the
    # largest is 128 KiB): what remains is NumPy's own iteration buffers (<= 8192 elements),
    # 0-d results and host-side bookkeeping.
    assert with_plan < 128 * 1024, with_plan
    assert without > 8 * with_plan, (with_plan, without)


def test_buffers_are_allocated_once_per_context(monkeypatch):
    monkeypatch.setenv("POPXL_MEMORY_PLAN", "1")
    ir, xs, ls, o, _, data = _transformer_ir()
    with popxl.Session(ir, "ipu_hw") as sess:
        ctx = sess._runtime.worker.ctxs[0]
        sess.run({xs: data[0][0], ls: data[0][1]})
        first = {k: [id(a) for a in v] for k, v in ctx.buffers.items()}
        sess.run({xs: data[1][0], ls: data[1][1]})
        assert {k: [id(a) for a in v] for k, v in ctx.buffers.items()} == first
        assert first


def test_outputs_of_two_calls_alive_together_get_separate_memory():
    """A graph called twice: its outputs are written into memory its caller provides, which
    must not be shared while both results are alive."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.full((4, 4), 2.0, np.float32), name="w")
        g = ir.create_graph(lambda a, w: ops.gelu(a @ w), w, w)
        a = popxl.constant(np.eye(4, dtype=np.float32), name="a")
        b = popxl.constant(np.full((4, 4), -1.0, np.float32), name="b")
        y1, = ops.call(g, a, w)
        y2, = ops.call(g, b, w)
        out = popxl.d2h_stream((2, 4, 4), popxl.float32, "out")
        ops.host_store(out, ops.concat([y1.reshape((1, 4, 4)), y2.reshape((1, 4, 4))], 0))
    program = Program(ir._data)
    assert program.graph(g.id).memory_plan.output_roots[0] is not None
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()[out]

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))

    np.testing.assert_allclose(got[0], gelu(np.eye(4) @ np.full((4, 4), 2.0)), rtol=1e-6)
    np.testing.assert_allclose(got[1], gelu(np.full((4, 4), -1.0) @ np.full((4, 4), 2.0)),
                               rtol=1e-6)


def test_in_place_is_refused_when_the_input_is_read_later():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((N, N), popxl.float32, "x")
        x = ops.host_load(s, "x")
        w = popxl.variable(np.ones((N, N), np.float32), name="w")
        y = x @ w                     # planned
        z = y + w                     # y is read again below: not in place
        u = z * y
        o = popxl.d2h_stream((N, N), popxl.float32, "u")
        ops.host_store(o, u)
    plan = Program(ir._data).main.memory_plan
    assert y.id in plan.assignment and z.id in plan.assignment
    assert plan.assignment[z.id][0] != plan.assignment[y.id][0]
    with popxl.Session(ir, "ipu_hw") as sess:
        xv = np.random.default_rng(1).normal(size=(N, N)).astype(np.float32)
        got = sess.run({s: xv})[o]
    yv = xv @ np.ones((N, N), np.float32)
    np.testing.assert_array_equal(got, (yv + 1) * yv)


def test_variables_and_buffers_start_on_64_byte_boundaries():
    """Compiled kernels load whole cache lines: every variable's storage and every planned
    buffer starts on a 64-byte boundary (NumPy aligns to 16), also after weights_from_host."""
    ir, xs, ls, _, _, data = _transformer_ir()
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({xs: data[0][0], ls: data[0][1]})
        sess.weights_from_host()
        ctx = sess._runtime.worker.ctxs[0]
        variables = [a for a in ctx.state if a is not None and a.size]
        buffers = [a for v in ctx.buffers.values() for a in v if a is not None and a.size]
        assert variables and buffers
        for a in variables + buffers:
            assert a.ctypes.data % 64 == 0, a.shape


def test_aligned_copy_keeps_values_shape_and_dtype():
    from popxl.engine.memory_plan import aligned_copy

    for src, dt in [(np.arange(7, dtype=np.float64), np.float32),
                    (np.ones((3, 5), np.float16).T, np.float16), (np.int32(4), np.int32),
                    (np.zeros((0, 3)), np.float32)]:
        got = aligned_copy(src, dt)
        assert got.dtype == dt and got.shape == np.shape(src) and got.flags.c_contiguous
        assert got.ctypes.data % 64 == 0 or got.size == 0
        np.testing.assert_array_equal(got, np.asarray(src).astype(dt))
