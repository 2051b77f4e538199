"""matmul against NumPy (2-D, batched, vectors), its gradients against finite differences, and
float16 accumulation in float32."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import check_forward, check_grads, run_ops

MATMUL = [
    ("matmul_2d", ops.matmul, np.matmul, [(2, 3), (3, 4)]),
    ("matmul_batched", ops.matmul, np.matmul, [(2, 2, 3), (3, 4)]),
    ("matmul_vec", ops.matmul, np.matmul, [(3,), (3, 2)]),
    ("matmul_matvec", ops.matmul, np.matmul, [(2, 3), (3,)]),
]
POSITIVE: dict = {}


@pytest.mark.parametrize("name,fn,ref,shapes", MATMUL, ids=[r[0] for r in MATMUL])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_forward_matches_numpy(name, fn, ref, shapes, dtype):
    check_forward(fn, ref, shapes, dtype, positive=POSITIVE.get(name, ()))


@pytest.mark.parametrize("name,fn,ref,shapes", MATMUL, ids=[r[0] for r in MATMUL])
def test_matmul_gradients_match_finite_differences(name, fn, ref, shapes):
    check_grads(fn, ref, shapes, positive=POSITIVE.get(name, ()))


def test_matmul_float16_accumulates_in_float32():
    a = np.full((1, 4096), 1.0, np.float16)
    b = np.full((4096, 1), 1.0 / 3, np.float16)
    out, = run_ops(ops.matmul, a, b)
    want = np.float16(4096 * np.float32(np.float16(1 / 3)))
    assert out[0, 0] == want


def test_float16_with_float32_builds_and_the_session_refuses_it():
    """As upstream, a matmul of float32 and float16 operands builds (its output takes lhs's
    dtype); the Session refuses it, naming the op and the two dtypes."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 3), np.float32), name="x")
        w = popxl.variable(np.ones((3, 4), np.float16), name="w")
        y = x @ w
    assert y.dtype == popxl.float32 and y.shape == (2, 4)
    with pytest.raises(ValueError, match=r"^Session: MatMul\.\d+ .*: its operands 'x' float32 and "
                                         r"'w' float16 must have one dtype \(the op builds, as "
                                         r"upstream, but cannot compile\)$"):
        popxl.Session(ir, "cpu")


@pytest.mark.parametrize("opt,ok", [("", True), ("float", True), ("HALF", True), ("foo", False)])
def test_partials_session_option_is_checked_as_upstream(opt, ok):
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().partialsTypeMatMuls = opt
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 2), np.float32), name="a")
        if ok:
            assert (a @ a).shape == (2, 2)
        else:
            with pytest.raises(ValueError, match="^str foo is not valid, must be 'float' or "
                                                 "'half'"):
                a @ a
