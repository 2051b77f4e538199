"""addons.autodiff, autodiff_with_accumulation (running mean of grads), recompute_graph."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.layers import Linear


def _linear_grads_numpy(x, w, b, dy):
    return {"weight": x.T @ dy, "bias": dy.sum(0), "x": dy @ w.T}


def _build(steps, reset_after=None):
    """Call fwd+grad (with accumulation) once per x in `steps`; returns the session pieces."""
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Linear(3).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        dfacts, dgraph = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        assert set(dfacts.to_dict()) == {"mean_accum_counter", "accum.bias", "accum.weight"}
        assert set(dgraph.args.to_dict()) == set(dfacts.to_dict())
        variables = facts.init()
        accum = dfacts.init()
        streams = []
        for i, _ in enumerate(steps):
            x_stream = popxl.h2d_stream((2, 4), popxl.float32, f"x{i}")
            dy_stream = popxl.h2d_stream((2, 3), popxl.float32, f"dy{i}")
            x = ops.host_load(x_stream)
            dy = ops.host_load(dy_stream)
            info = fwd.bind(variables).call_with_info(x)
            outs = dgraph.bind(accum).call(dy, args=dgraph.grad_graph_info.inputs_dict(info))
            assert outs == ()   # accumulated grads are no longer outputs
            if reset_after == i:
                ops.var_updates.accumulator_scale_(accum.mean_accum_counter, 0.0)
            streams.append((x_stream, dy_stream))
    return ir, variables, accum, streams


@pytest.mark.parametrize("n_calls, reset_after", [(1, None), (3, None), (3, 0)])
def test_accumulator_is_running_mean_of_grads(n_calls, reset_after):
    rng = np.random.default_rng(n_calls)
    xs = [rng.normal(size=(2, 4)).astype(np.float32) for _ in range(n_calls)]
    dys = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(n_calls)]
    ir, variables, accum, streams = _build(xs, reset_after)
    s = popxl.Session(ir, "ipu_hw")
    w = s.get_tensor_data(variables.weight).copy()
    b = s.get_tensor_data(variables.bias).copy()
    inputs = {}
    for (xs_, dys_), x, dy in zip(streams, xs, dys):
        inputs[xs_], inputs[dys_] = x, dy
    with s:
        s.run(inputs)
        data = s.get_tensors_data(accum.tensors)
    first = 0 if reset_after is None else reset_after + 1
    grads = [_linear_grads_numpy(x, w, b, dy) for x, dy in zip(xs[first:], dys[first:])]
    np.testing.assert_allclose(data[accum.accum.weight],
                               np.mean([g["weight"] for g in grads], 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data[accum.accum.bias],
                               np.mean([g["bias"] for g in grads], 0), rtol=1e-5, atol=1e-6)
    assert data[accum.mean_accum_counter] == len(grads)


def test_autodiff_with_accumulation_keeps_user_required_grads():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Linear(3).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        x_in = fwd.graph.inputs[0]
        dfacts, dgraph = addons.autodiff_with_accumulation(
            fwd, [fwd.args.weight], grads_required=[x_in])
        assert len(dgraph.graph.outputs) == 1
        assert dgraph.graph.outputs[0].shape == (2, 4)
        assert "accum.weight" in dgraph.args and "accum.bias" not in dgraph.args
        # a tensor that is not a named arg is named after its (sanitised) tensor name
        dfacts2, dgraph2 = addons.autodiff_with_accumulation(
            addons.GraphWithNamedArgs(fwd.graph), [fwd.args.bias])
        (key,) = [k for k in dgraph2.args.to_dict() if k.startswith("accum.")]
        assert key == "accum." + addons.sanitise(fwd.args.bias.name)


def test_autodiff_stitches_and_matches_numpy():
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(2, 4)).astype(np.float32)
    dy0 = rng.normal(size=(2, 3)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Linear(3).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        dgraph = addons.autodiff(fwd)
        assert dgraph.args.len_flat() == 0
        assert dgraph.grad_graph_info.forward_graph == fwd.graph
        variables = facts.init()
        x = popxl.variable(x0)
        info = fwd.bind(variables).call_with_info(x)
        dy = popxl.variable(dy0)
        dinfo = dgraph.call_with_info(dy, args=dgraph.grad_graph_info.inputs_dict(info))
        grads = dgraph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, dinfo)
        streams = {k: addons.host_store(grads[t]) for k, t in
                   [("x", x), ("weight", variables.weight), ("bias", variables.bias)]}
    with popxl.Session(ir, "ipu_hw") as s:
        out = s.run()
        w = s.get_tensor_data(variables.weight)
    want = _linear_grads_numpy(x0, w, None, dy0)
    for k, st in streams.items():
        np.testing.assert_allclose(out[st], want[k], rtol=1e-5, atol=1e-6)


def test_recompute_graph_same_numbers():
    rng = np.random.default_rng(4)
    x0 = rng.normal(size=(2, 4)).astype(np.float32)
    dy0 = rng.normal(size=(2, 10)).astype(np.float32)

    class Two(addons.Module):
        def __init__(self):
            super().__init__()
            self.a = Linear(5)
            self.b = Linear(10)

        def build(self, x):
            return self.b(ops.gelu(self.a(x)))

    results = []
    for recompute in (False, True):
        np.random.seed(0)
        ir = popxl.Ir()
        with ir.main_graph:
            facts, fwd = Two().create_graph(popxl.TensorSpec((2, 4), popxl.float32))
            dgraph = addons.autodiff(fwd)
            if recompute:
                dgraph = addons.recompute_graph(dgraph)
                assert len(ir._pb_ir.getAllGraphs()) == 4
                from popxl.transforms import ExpectedConnectionType as T
                fwd_ins = set(fwd.graph.inputs)
                assert all(e.fwd_tensor in fwd_ins for e in dgraph.grad_graph_info.expected_inputs
                           if e.connection_type == T.Fwd)
            variables = facts.init()
            info = fwd.bind(variables).call_with_info(popxl.variable(x0))
            dinfo = dgraph.call_with_info(popxl.variable(dy0),
                                          args=dgraph.grad_graph_info.inputs_dict(info))
            streams = [addons.host_store(t) for t in dinfo.outputs]
        with popxl.Session(ir, "ipu_hw") as s:
            out = s.run()
        results.append([out[st] for st in streams])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6)
