"""Autodiff sums several gradient contributions with one `Sum` op; decompose_sum splits it into
an Add + AddLhsInplace chain with the same bits."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _grad_program(dtype, decompose: bool):
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3, 4), dtype)

        def fwd(x, a, b):
            return x * a + x * b + ops.gelu(x)   # x feeds three ops: three contributions

        g = ir.create_graph(fwd, spec, spec, spec)
        info = popxl.transforms.autodiff(g, grads_required=[g.inputs[0]])
        bwd = info.graph
        sums = [op for op in bwd._data.ops if op.type == "Sum"]
        if decompose:
            assert popxl.transforms.decompose_sum(bwd) is bwd
        streams = [popxl.h2d_stream((3, 4), dtype, n) for n in ("x", "a", "b", "dy")]
        x, a, b, dy = (ops.host_load(s) for s in streams)
        call = ops.call_with_info(g, x, a, b)
        (dx,) = ops.call(bwd, dy, inputs_dict=info.inputs_dict(call))
        out = popxl.d2h_stream((3, 4), dtype, "dx")
        ops.host_store(out, dx)
    return ir, streams, out, sums, bwd


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
def test_decomposed_sum_is_bitwise_equal(dtype):
    rng = np.random.default_rng(0)
    data = [rng.normal(size=(3, 4)).astype(dtype.as_numpy()) for _ in range(4)]
    results = []
    for decompose in (False, True):
        ir, streams, out, sums, bwd = _grad_program(dtype, decompose)
        assert len(sums) == 1 and len(sums[0].inputs) == 3
        types = [op.type for op in bwd._data.ops]
        if decompose:
            assert "Sum" not in types
            assert types.count("AddLhsInplace") == 1
        else:
            assert "Sum" in types
        with popxl.Session(ir, "ipu_hw") as s:
            results.append(s.run(dict(zip(streams, data)))[out])
    assert results[0].tobytes() == results[1].tobytes()
    if dtype == popxl.float32:
        x, a, b, dy = (d.astype(np.float64) for d in data)
        c = np.sqrt(2 / np.pi)
        inner = c * (x + 0.044715 * x ** 3)
        dgelu = 0.5 * (1 + np.tanh(inner)) + 0.5 * x * (1 - np.tanh(inner) ** 2) * c * (
            1 + 3 * 0.044715 * x ** 2)
        np.testing.assert_allclose(results[0], dy * (a + b + dgelu), rtol=1e-5, atol=1e-6)


def test_single_contribution_makes_no_sum_and_bad_argument():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: x * 2.0, popxl.TensorSpec((2,), popxl.float32))
        info = popxl.transforms.autodiff(g)
    assert "Sum" not in [op.type for op in info.graph._data.ops]
    with pytest.raises(TypeError, match="popxl.Graph"):
        popxl.transforms.decompose_sum("graph")
