"""Activations gelu (tanh approximation) and softmax against NumPy, and their gradients against
finite differences."""
import numpy as np
import pytest

import popxl.ops as ops

from harness import check_forward, check_grads


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


ACTIVATIONS = [
    ("gelu", ops.gelu, _gelu, [(3, 4)]),
    ("softmax", lambda a: ops.softmax(a, -1), lambda a: _softmax(a, -1), [(3, 5)]),
    ("softmax_axis0", lambda a: ops.softmax(a, 0), lambda a: _softmax(a, 0), [(3, 5)]),
]
POSITIVE: dict = {}


@pytest.mark.parametrize("name,fn,ref,shapes", ACTIVATIONS, ids=[r[0] for r in ACTIVATIONS])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activation_forward_matches_numpy(name, fn, ref, shapes, dtype):
    check_forward(fn, ref, shapes, dtype, positive=POSITIVE.get(name, ()))


@pytest.mark.parametrize("name,fn,ref,shapes", ACTIVATIONS, ids=[r[0] for r in ACTIVATIONS])
def test_activation_gradients_match_finite_differences(name, fn, ref, shapes):
    check_grads(fn, ref, shapes, positive=POSITIVE.get(name, ()))
