"""`ops.collectives.all_reduce` and its identical variants: reductions across the IPUs of one
replica, against NumPy, with gradients against the chain rule written in NumPy (the plain
all-reduce) and the Megatron f/g semantics (the identical variants)."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import grads, run_ops

C = ops.collectives
REFS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


def on_ipus(fn, xs):
    """Place a copy of each input on its own IPU, then call fn on the list."""
    placed = []
    for i, x in enumerate(xs):
        with popxl.ipu(i):
            placed.append(x * 1 if x.dtype != popxl.bool else ops.logical_not(ops.logical_not(x)))
    return tuple(fn(placed))


@pytest.mark.parametrize("op", ["add", "mean", "min", "max", "mul", "square_add"])
@pytest.mark.parametrize("n", [2, 3])
def test_forward_every_op_float32(op, n):
    rng = np.random.default_rng(n)
    xs = [rng.normal(size=(2, 5)).astype(np.float32) for _ in range(n)]
    outs = run_ops(lambda *ts: on_ipus(lambda p: C.all_reduce(p, op=op), ts), *xs)
    if op == "mean":
        want = sum(xs) / n
    elif op == "square_add":
        want = sum(x * x for x in xs)
    else:
        want = xs[0]
        for x in xs[1:]:
            want = REFS[op](want, x)
    assert len(outs) == n
    for o in outs:
        np.testing.assert_allclose(o, want, rtol=1e-6)


def test_forward_float16_accumulates_in_float32_and_logical_ops():
    xs = [np.full((4,), v, np.float16) for v in (2048.0, 1.0, 1.0)]
    outs = run_ops(lambda *ts: on_ipus(lambda p: C.all_reduce(p), ts), *xs)
    assert outs[0].dtype == np.float16 and outs[0][0] == np.float16(2050.0)
    a, b = np.array([True, False, True]), np.array([True, True, False])
    out_and = run_ops(lambda x, y: on_ipus(lambda p: C.all_reduce(p, op="and"), (x, y)), a, b)
    out_or = run_ops(lambda x, y: on_ipus(lambda p: C.all_reduce(p, op="or"), (x, y)), a, b)
    np.testing.assert_array_equal(out_and[1], a & b)
    np.testing.assert_array_equal(out_or[0], a | b)


def test_identical_variants_forward():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3,)).astype(np.float32) for _ in range(2)]
    same = run_ops(lambda *ts: on_ipus(C.all_reduce_identical_inputs, ts), *xs)
    summed = run_ops(lambda *ts: on_ipus(C.all_reduce_identical_grad_inputs, ts), *xs)
    for o, x in zip(same, xs):
        np.testing.assert_array_equal(o, x)
    for o in summed:
        np.testing.assert_allclose(o, xs[0] + xs[1], rtol=1e-6)


def test_outputs_sit_on_their_inputs_ipus_and_print_as_one_op():
    ir = popxl.Ir()
    with ir.main_graph:
        ts = []
        for i in (2, 5):
            with popxl.ipu(i):
                ts.append(popxl.variable(np.zeros(3, np.float32)) * 1.0)
        outs = C.all_reduce(ts)
        assert [o.ipu for o in outs] == [2, 5]
        assert [o.name for o in outs] == [f"{t.name}_all_reduce" for t in ts]
        op = ir.main_graph._data.ops[-1]
        assert op.type == "AllReduce" and op.attrs["ipus"] == (2, 5)


def test_gradients_against_numpy_and_fg_semantics():
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(3)]
    ws = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(3)]
    dys = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(3)]

    def net(fn):
        def build(*ts):
            placed = []
            for i in range(3):
                with popxl.ipu(i):
                    placed.append(ts[i] * ts[3 + i])
            return tuple(fn(placed))
        return build

    # plain all-reduce: the true gradient of y_i = sum_j x_j w_j, i.e. of
    # sum_i <y_i, dy_i> w.r.t. x_j: w_j * sum_i dy_i
    _, g = grads(net(C.all_reduce), xs + ws, dys)
    dy_sum = sum(d.astype(np.float64) for d in dys)
    for j in range(3):
        np.testing.assert_allclose(g[j], ws[j] * dy_sum, rtol=1e-5)
    # identical inputs (f): forward identity, backward all-reduce of dy_i * w_i
    _, g = grads(net(C.all_reduce_identical_inputs), xs + ws, dys)
    want = sum(d for d in dys)
    for i in range(3):
        np.testing.assert_allclose(g[i], want * ws[i], rtol=1e-5)
    # identical grad inputs (g): forward all-reduce, backward identity
    _, g = grads(net(C.all_reduce_identical_grad_inputs), xs + ws, dys)
    for i in range(3):
        np.testing.assert_allclose(g[i], dys[i] * ws[i], rtol=1e-6)


def test_same_bits_as_the_replicated_all_reduce():
    """Reducing over 4 IPUs of one replica or over 4 replicas follows the same tree."""
    rng = np.random.default_rng(2)
    xs = (rng.normal(size=(4, 257)) * 1e3).astype(np.float32)
    ipu = run_ops(lambda *ts: on_ipus(C.all_reduce, ts), *list(xs))[0]
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        s = popxl.h2d_stream((257,), popxl.float32, "x")
        out = popxl.d2h_stream((257,), popxl.float32, "y")
        ops.host_store(out, C.replicated_all_reduce(ops.host_load(s)))
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run({s: xs})[out]
    for r in range(4):
        assert got[r].tobytes() == ipu.tobytes()


def test_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(3, np.float32), name="a")
        b = popxl.variable(np.zeros(4, np.float32), name="b")
        c = popxl.variable(np.zeros(3, np.float32), name="c")
        with pytest.raises(TypeError, match="non-empty list"):
            C.all_reduce(a)
        with pytest.raises(TypeError, match="non-empty list"):
            C.all_reduce([])
        with pytest.raises(ValueError, match="shape and dtype of 'a'"):
            C.all_reduce([a, b], ipus=[0, 1])
        with pytest.raises(ValueError, match="2 tensors but 3 ipus"):
            C.all_reduce([a, c], ipus=[0, 1, 2])
        with pytest.raises(ValueError, match="Could not automatically infer the IPU of all "
                                             "input Tensors `ts`"):
            C.all_reduce([a, c])                 # variables nothing consumes: no IPU (upstream)
        a1, c1 = a + 0, c + 0
        with pytest.raises(ValueError, match="different IPU"):
            C.all_reduce([a1, c1])               # both on IPU 0
        with pytest.raises(ValueError, match="valid ops are"):
            C.all_reduce([a, c], ipus=[0, 1], op="local")
        with pytest.raises(TypeError, match="'ipus' must be a list"):
            C.all_reduce([a, c], ipus=[0, "1"])


def test_only_add_is_differentiable():
    ir = popxl.Ir()
    with ir.main_graph:
        def fwd(x, y):
            return tuple(C.all_reduce([x, y], ipus=[0, 1], op="max"))
        spec = popxl.TensorSpec((3,), popxl.float32)
        g = ir.create_graph(fwd, spec, spec)
        with pytest.raises(NotImplementedError, match="only defined for op 'add'"):
            popxl.transforms.autodiff(g)
