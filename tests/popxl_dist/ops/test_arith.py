"""Arithmetic ops (add, sub, mul, div, negate, scaled_add(_)) against NumPy, and their gradients
against finite differences."""
import numpy as np
import pytest

import popxl.ops as ops

from harness import check_forward, check_grads, run_ops

rng = np.random.default_rng(0)

# (name, builder, numpy reference, input shapes)
ARITH = [
    ("add_broadcast", lambda a, b: a + b, lambda a, b: a + b, [(2, 3), (3,)]),
    ("sub", ops.sub, np.subtract, [(2, 3), (2, 1)]),
    ("mul", ops.mul, np.multiply, [(2, 3), (1, 3)]),
    ("div", ops.div, np.divide, [(2, 3), (2, 3)]),
    ("negate", ops.negate, np.negative, [(4,)]),
    ("scaled_add", lambda a, b: ops.scaled_add(a, b, 0.5, -2.0), lambda a, b: 0.5 * a - 2 * b,
     [(2, 3), (2, 3)]),
]
ARITH_GRADS = [r for r in ARITH if r[0] != "scaled_add"]     # ScaledAdd has no grad op
POSITIVE = {"div": (1,)}


@pytest.mark.parametrize("name,fn,ref,shapes", ARITH, ids=[r[0] for r in ARITH])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_arith_forward_matches_numpy(name, fn, ref, shapes, dtype):
    check_forward(fn, ref, shapes, dtype, positive=POSITIVE.get(name, ()))


@pytest.mark.parametrize("name,fn,ref,shapes", ARITH_GRADS, ids=[r[0] for r in ARITH_GRADS])
def test_arith_gradients_match_finite_differences(name, fn, ref, shapes):
    check_grads(fn, ref, shapes, positive=POSITIVE.get(name, ()))


def test_scaled_add_inplace_with_tensor_coefficients_and_mixed_dtypes():
    def fn(x, y, b):
        ops.scaled_add_(x, y, a=2.0, b=b)
        return x

    x = rng.normal(size=(2, 3)).astype(np.float32)
    y = rng.normal(size=(2, 3)).astype(np.float16)
    b = np.array(-0.5, np.float32)
    out, = run_ops(fn, x, y, b)
    np.testing.assert_allclose(out, 2 * x - 0.5 * y.astype(np.float32), rtol=1e-6)
