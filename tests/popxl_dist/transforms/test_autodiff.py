"""autodiff: nested calls against finite differences, stitching, GradGraphInfo, strictness."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms

from harness import grads, numeric_grads


def _mlp(x, w1, w2):
    """Two nested levels of calls: outer graph calls an inner linear+gelu graph twice."""
    ir = popxl.gir()

    def inner(h, w):
        return ops.gelu(h @ w)

    g_in = ir.create_graph(inner, x, w1)
    h, = ops.call(g_in, x, w1)
    g_in2 = ir.create_graph(inner, h, w2)
    y, = ops.call(g_in2, h, w2)
    return ops.sum(y * y, axis=1)


def test_nested_calls_match_finite_differences():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3))
    w1 = rng.normal(size=(3, 4)) * 0.5
    w2 = rng.normal(size=(4, 2)) * 0.5
    dy = rng.normal(size=(2,))
    _, got = grads(_mlp, [x, w1, w2], [dy])
    want = numeric_grads(_mlp, [x, w1, w2], [dy])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_same_subgraph_called_twice_shares_one_grad_graph():
    def fn(x, w1, w2):
        ir = popxl.gir()
        g = ir.create_graph(lambda a, b: ops.gelu(a @ b), x, w1)
        h, = ops.call(g, x, w1)
        y, = ops.call(g, h, w2)
        return y

    rng = np.random.default_rng(2)
    x, w1, w2 = rng.normal(size=(2, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    dy = rng.normal(size=(2, 3))
    _, got = grads(fn, [x, w1, w2], [dy])
    want = numeric_grads(fn, [x, w1, w2], [dy])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_grad_graph_info_and_stitching():
    ir = popxl.Ir()
    with ir.main_graph:
        def lin(x, w):
            return ops.gelu(x @ w)

        xs = popxl.TensorSpec((2, 3), popxl.float32)
        ws = popxl.TensorSpec((3, 4), popxl.float32)
        g = ir.create_graph(lin, xs, ws)
        assert len(g.outputs) == 1
        x = popxl.variable(np.ones((2, 3), np.float32), name="x")
        w = popxl.variable(np.ones((3, 4), np.float32), name="w")
        info = ops.call_with_info(g, x, w)
        bwd = transforms.autodiff(g)
        # gelu's input (the matmul output) is needed by the gradient: stitched as a new output
        assert len(g.outputs) == 2 and len(info.outputs) == 2
        kinds = [e.connection_type for e in bwd.expected_inputs]
        assert kinds[0] == transforms.ExpectedConnectionType.FwdGrad
        assert all(k == transforms.ExpectedConnectionType.Fwd for k in kinds[1:])
        fwd_ids = [e.fwd_tensor.id for e in bwd.expected_inputs[1:]]
        assert fwd_ids == sorted(fwd_ids)
        assert [t.id for t in bwd.outputs] == [t.id for t in g.inputs]
        assert bwd.graph.id == f"{g.id}_bwd"
        dx_call = ops.call_with_info(bwd.graph, popxl.constant(np.ones((2, 4), np.float32)),
                                     inputs_dict=bwd.inputs_dict(info))
        mapping = bwd.fwd_parent_ins_to_grad_parent_outs(info, dx_call)
        assert set(mapping) == {x, w}
        assert dx_call.outputs[0].name.startswith("Gradient___")
        assert "GradGraphInfo[" in repr(bwd)


def test_required_gradient_that_does_not_exist_raises():
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(x, lab):
            return x * 2.0, ops.cast(lab, popxl.float32)

        g = ir.create_graph(fn, popxl.TensorSpec((2,), popxl.float32),
                            popxl.TensorSpec((2,), popxl.int32))
        with pytest.raises(RuntimeError, match="Unable to provide required gradient"):
            transforms.autodiff(g)
        info = transforms.autodiff(g, grads_required=[g.inputs[0]])
        assert len(info.expected_outputs) == 1


def test_modifying_op_refused():
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(x):
            ops.add_(x, x)
            return x * 1.0

        g = ir.create_graph(fn, popxl.TensorSpec((2,), popxl.float32))
        with pytest.raises(RuntimeError, match="contains a modifying op"):
            transforms.autodiff(g)


F = popxl.float32
# op -> (builder, input specs, the forward tensors upstream's grad ops take: "inI" / "outJ")
UPSTREAM_STASH = {
    "mul": (lambda a, b: a * b, [(4,), (4,)], {"in0", "in1", "out0"}),
    "div": (lambda a, b: a / b, [(4,), (4,)], {"in0", "in1", "out0"}),
    "sub": (lambda a, b: a - b, [(4,), (4,)], {"in0", "in1", "out0"}),
    "add": (lambda a, b: a + b, [(4,), (4,)], set()),
    "fmod": (lambda a, b: ops.fmod(a, b), [(4,), (4,)], {"in0", "in1", "out0"}),
    "swish": (lambda x: ops.swish(x), [(4,)], {"in0"}),
    "cumsum": (lambda x: ops.cumsum(x, 0), [(4,)], {"in0"}),
    "max_pool": (lambda x: ops.max_pool(x, (2, 2)), [(1, 1, 4, 4)], {"in0", "out0"}),
    "average_pool": (lambda x: ops.average_pool(x, (2, 2)), [(1, 1, 4, 4)], {"in0", "out0"}),
    "relu": (lambda x: ops.relu(x), [(4,)], {"out0"}),
    "softmax": (lambda x: ops.softmax(x, -1), [(2, 4)], {"out0"}),
    "matmul": (lambda a, b: a @ b, [(2, 3), (3, 4)], {"in0", "in1"}),
}


@pytest.mark.parametrize("name", sorted(UPSTREAM_STASH))
def test_the_stashed_forward_tensors_are_upstreams(name):
    """The forward tensors a one-op graph's gradient takes are those upstream's grad ops take
    (their gradInputInfo: e.g. MulArg0GradOp takes both arguments and the output)."""
    fn, shapes, want = UPSTREAM_STASH[name]
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(fn, *[popxl.TensorSpec(s, F) for s in shapes])
        op = g._data.ops[-1]
        role = {t: f"in{i}" for i, t in enumerate(op.inputs)}
        role.update({t: f"out{j}" for j, t in enumerate(op.outputs)})
        info = popxl.transforms.autodiff(g)
    got = {role[e.fwd_tensor.id] for e in info.expected_inputs
           if e.connection_type == popxl.transforms.ExpectedConnectionType.Fwd}
    assert got == want


def test_the_stash_is_ordered_by_forward_tensor_id_after_the_provided_gradients():
    """As upstream (its bwd graph marks stashed tensors as inputs in the order of a map keyed
    by tensor id): the FwdGrad inputs in grads_provided order, then the Fwd ones by id."""
    ir = popxl.Ir()
    with ir.main_graph:
        def body(x, w):
            h = x * w
            return ops.softmax(h * 0.5, -1)
        g = ir.create_graph(body, popxl.TensorSpec((2, 4), F), popxl.TensorSpec((2, 4), F))
        info = popxl.transforms.autodiff(g)
    kinds = [e.connection_type.name for e in info.expected_inputs]
    ids = [e.fwd_tensor.id for e in info.expected_inputs if e.connection_type.name == "Fwd"]
    assert kinds[0] == "FwdGrad" and set(kinds[1:]) == {"Fwd"}
    assert ids == sorted(ids) and len(ids) == 6      # x, w, x*w, the 0.5, (x*w)*0.5, softmax
