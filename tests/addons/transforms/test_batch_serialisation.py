"""batch_serialise / batch_serialise_fwd_and_grad: every io_mode, host and remote handles, row
offsets (int / None / callable), sharded handles and seed inputs, bitwise against the graph
called `steps` times in order."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.transforms.batch_serialisation import BatchSerialResult

B, D = 2, 3


class Affine(addons.Module):
    """y = gelu(x * w + b): element-wise, so a NumPy reference is exact to the bit."""

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.random.normal, 0, 1, (D,)), popxl.float32)
        b = self.add_variable_input("b", partial(np.random.normal, 0, 1, (D,)), popxl.float32)
        return ops.gelu(x * w + b)


def _io_tiles(ir, n=32):
    ir._pb_ir.getSessionOptions().numIOTiles = n


def _session_run(ir, inputs, outs, tensors=()):
    with popxl.Session(ir, "ipu_hw") as s:
        res = s.run(inputs)
        data = s.get_tensors_data(list(tensors)) if tensors else {}
    return [res[o] for o in outs], data


@pytest.mark.parametrize("io_mode", ["compute", "io", "io_overlapped"])
def test_host_streams_equal_plain_calls(io_mode):
    steps = 4
    xs = np.random.default_rng(0).normal(size=(steps, B, D)).astype(np.float32)
    results = []
    for serialised in (True, False):
        np.random.seed(1)
        ir = popxl.Ir()
        _io_tiles(ir)
        with ir.main_graph:
            facts, g = Affine().create_graph(popxl.TensorSpec((B, D), popxl.float32))
            x_in = popxl.h2d_stream((B, D), popxl.float32, "x")
            y_out = popxl.d2h_stream((B, D), popxl.float32, "y")
            x_back = popxl.d2h_stream((B, D), popxl.float32, "x_back")
            weights = facts.init()
            if serialised:
                x_t, (y_t,) = g.graph.inputs[0], g.graph.outputs
                bs = addons.batch_serialise(g, steps, {x_t: x_in}, {y_t: y_out, x_t: x_back},
                                            {}, io_mode=io_mode)
                assert isinstance(bs, BatchSerialResult)
                assert bs.graph.graph.name.startswith("Affine__repeat_graph")
                assert [t.name for t in bs.graph.graph.inputs] == \
                    ["batch_serial_loop_index", "w", "b"]
                assert sorted(bs.graph.args.keys_flat()) == ["b", "w"]
                assert bs.remap_tensors(g.args).to_dict().keys() == g.args.to_dict().keys()
                bs.graph.bind(weights).call(0)
                types = [op.type for gd in ir._data.graphs.values() for op in gd.ops]
                assert ("IoTileCopy" in types) == (io_mode != "compute")
                assert ("Loop" in types)
            else:
                for _ in range(steps):
                    x = ops.host_load(x_in, "x")
                    (y,) = g.bind(weights).call(x)
                    ops.host_store(y_out, y)
                    ops.host_store(x_back, x)
        ir.num_host_transfers = steps
        results.append(_session_run(ir, {x_in: xs}, [y_out, x_back])[0])
    (y_bs, x_bs), (y_plain, x_plain) = results
    np.testing.assert_array_equal(x_bs, xs)
    assert y_bs.tobytes() == y_plain.tobytes()


def test_io_modes_need_io_tiles_and_overlap_needs_two_steps():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, g = Affine().create_graph(popxl.TensorSpec((B, D), popxl.float32))
        s = popxl.h2d_stream((B, D), popxl.float32, "x")
        for mode in ("io", "io_overlapped"):
            with pytest.raises(ValueError, match="numIOTiles"):
                addons.batch_serialise(g, 2, {g.graph.inputs[0]: s}, {}, {}, io_mode=mode)
        with pytest.raises(ValueError, match="io_mode must be one of"):
            addons.batch_serialise(g, 2, {}, {}, {}, io_mode="fast")
        _io_tiles(ir)
        with pytest.warns(UserWarning, match="io_overlapped' needs steps >= 2"):
            addons.batch_serialise(g, 1, {g.graph.inputs[0]: s}, {}, {}, io_mode="io_overlapped")


def _phased_chain(io_mode: str, layers: int, steps: int, sharded: bool, replicas: int):
    """Write micro batches from the host into row 0 of an activation buffer, run the graph
    over rows 0..layers-1 (row n -> row n + 1), then stream row `layers` (via row_offset None
    on a copy buffer and a callable offset) back to the host."""
    np.random.seed(3)
    ir = popxl.Ir(replication=replicas)
    _io_tiles(ir)
    with ir.main_graph, popxl.in_sequence(True):
        facts, g = Affine().create_graph(popxl.TensorSpec((B, D), popxl.float32))
        x_t, (y_t,) = g.graph.inputs[0], g.graph.outputs
        x_in = popxl.h2d_stream((B, D), popxl.float32, "x")
        y_out = popxl.d2h_stream((B, D), popxl.float32, "y")
        group = ir.replica_grouping() if sharded else None
        acts = addons.batch_serial_buffer(x_t, steps, layers + 1, shard_group=group)
        weights = facts.init()

        # Host -> row 0 (an identity graph with a host load and a buffer store).
        ident = ir.create_graph(lambda x: x * 1.0, x_t)
        bs_in = addons.batch_serialise(addons.GraphWithNamedArgs(ident), steps,
                                       {ident.inputs[0]: x_in},
                                       {}, {ident.inputs[0]: (acts, 0, group)}, io_mode=io_mode)
        bs_in.graph.call(0)

        # Row n -> row n + 1 for every layer.
        bs = addons.batch_serialise(g, steps, {x_t: addons.RemoteHandle(acts, 0, group)}, {},
                                    {y_t: addons.RemoteHandle(acts, 1, group)}, rows=layers,
                                    io_mode=io_mode)
        for n in range(layers):
            bs.graph.bind(weights).call(n)

        # Row `layers` -> a one-row buffer (row_offset None) -> host, via a callable offset.
        last = addons.batch_serial_buffer(x_t, steps, 1, shard_group=group)
        copy = addons.batch_serialise(addons.GraphWithNamedArgs(ident), steps,
                                      {ident.inputs[0]: (acts, lambda n: n + layers, group)},
                                      {}, {ident.outputs[0]: (last, None, group)},
                                      io_mode=io_mode)
        copy.graph.call(0)
        out = addons.batch_serialise(addons.GraphWithNamedArgs(ident), steps,
                                     {ident.inputs[0]: (last, None, group)},
                                     {ident.outputs[0]: y_out}, {}, io_mode=io_mode)
        out.graph.call(0)
    assert acts.entries == steps * (layers + 1) and last.entries == steps
    ir.num_host_transfers = steps
    return ir, x_in, y_out, weights


@pytest.mark.parametrize("io_mode, sharded, replicas", [
    ("compute", False, 1), ("io", False, 1), ("io_overlapped", False, 1),
    ("io", True, 2), ("io_overlapped", True, 2)])
def test_remote_rows_offsets_and_sharding(io_mode, sharded, replicas):
    layers, steps = 3, 3
    ir, x_in, y_out, weights = _phased_chain(io_mode, layers, steps, sharded, replicas)
    rng = np.random.default_rng(5)
    xs = rng.normal(size=(steps, 1, B, D)).astype(np.float32)
    # A sharded buffer holds one value split over the group: every replica has the same data.
    xs = np.repeat(xs, replicas, axis=1) if replicas > 1 else xs[:, 0]
    (ys,), data = _session_run(ir, {x_in: xs}, [y_out], weights.tensors)
    w, b = data[weights.w], data[weights.b]
    expected = xs * np.float32(1.0)
    for _ in range(layers):
        z = expected * w + b
        expected = (0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
                    ).astype(np.float32)
    np.testing.assert_allclose(ys, expected, rtol=1e-5, atol=1e-6)
    if (io_mode, sharded) != ("compute", False):
        ref, x2, y2, w2 = _phased_chain("compute", layers, steps, False, replicas)
        (ys_ref,), _ = _session_run(ref, {x2: xs}, [y2])
        assert ys.tobytes() == ys_ref.tobytes()
    if sharded:
        types = [op.type for gd in ir._data.graphs.values() for op in gd.ops]
        assert "ReplicatedAllGather" in types and "ReplicatedReduceScatter" in types


class Noisy(addons.Module):
    def build(self, x: popxl.Tensor, seed: popxl.Tensor) -> popxl.Tensor:
        return x + ops.random_normal(seed, x.shape, 0.0, 1.0)


def test_seed_input_gets_a_fresh_split_every_step():
    steps = 3
    seed0 = popxl.create_seeds(7)
    results = []
    for serialised in (True, False):
        ir = popxl.Ir()
        with ir.main_graph:
            _, g = Noisy().create_graph(popxl.TensorSpec((B, D), popxl.float32),
                                        popxl.TensorSpec((2,), popxl.uint32))
            x_in = popxl.h2d_stream((B, D), popxl.float32, "x")
            y_out = popxl.d2h_stream((B, D), popxl.float32, "y")
            seed = popxl.variable(seed0, popxl.uint32, "seed")
            if serialised:
                x_t, s_t = g.graph.inputs
                bs = addons.batch_serialise(g, steps, {x_t: x_in}, {g.graph.outputs[0]: y_out},
                                            {}, seed_input=s_t, io_mode="compute")
                assert [t.name for t in bs.graph.graph.inputs] == \
                    ["batch_serial_loop_index", "seed"]
                bs.graph.call(0, seed)
            else:
                for _ in range(steps):
                    step_seed, seed = ops.split_random_seed(seed)
                    (y,) = g.call(ops.host_load(x_in), step_seed)
                    ops.host_store(y_out, y)
        ir.num_host_transfers = steps
        xs = np.zeros((steps, B, D), np.float32)
        results.append(_session_run(ir, {x_in: xs}, [y_out])[0][0])
    assert results[0].tobytes() == results[1].tobytes()
    assert not np.array_equal(results[0][0], results[0][1])   # different noise every step


def _fwd_and_grad(serialised: bool, steps: int, io_mode: str = "compute"):
    np.random.seed(11)
    ir = popxl.Ir()
    _io_tiles(ir)
    with ir.main_graph, popxl.in_sequence(True):
        facts, fwd = Affine().create_graph(popxl.TensorSpec((B, D), popxl.float32))
        dfacts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors,
                                                        grads_required=[fwd.graph.inputs[0]])
        x_in = popxl.h2d_stream((B, D), popxl.float32, "x")
        dy_in = popxl.h2d_stream((B, D), popxl.float32, "dy")
        y_out = popxl.d2h_stream((B, D), popxl.float32, "y")
        dx_out = popxl.d2h_stream((B, D), popxl.float32, "dx")
        weights = facts.init()
        accums = dfacts.init()
        x_t, (y_t,) = fwd.graph.inputs[0], fwd.graph.outputs[:1]
        dy_t, (dx_t,) = bwd.graph.inputs[0], bwd.graph.outputs
        if serialised:
            n_fwd_inputs = len(bwd.graph.inputs)
            f_res, g_res = addons.batch_serialise_fwd_and_grad(
                fwd, bwd, fwd.args, steps, {x_t: x_in, dy_t: dy_in}, {y_t: y_out, dx_t: dx_out},
                {}, io_mode=io_mode)
            assert len(bwd.graph.inputs) == n_fwd_inputs
            # Activations that are neither weights nor loaded got buffers; weights are args.
            assert set(f_res.stored_buffers) and all(
                t._graph == fwd.graph for t in f_res.stored_buffers)
            # Named forward inputs first (only `w`: the gradient does not need `b`).
            assert bwd.args.keys_flat() == ["w", "mean_accum_counter", "accum.b", "accum.w"]
            f_res.graph.bind(weights).call(0)
            grad_args = accums.copy()
            grad_args.update(weights)
            g_res.graph.bind(grad_args).call(0)
            info = g_res.graph.grad_graph_info
            assert info.forward_graph == f_res.graph.graph
            call = ops.call_with_info(f_res.graph.graph, 0, inputs_dict=f_res.graph.bind(
                weights).args)
            assert weights.w in set(info.inputs_dict(call).values())
        else:
            infos = []
            for _ in range(steps):
                info = fwd.bind(weights).call_with_info(ops.host_load(x_in))
                ops.host_store(y_out, info.outputs[0])
                infos.append(info)
            for info in infos:
                (dx,) = bwd.bind(accums).call(ops.host_load(dy_in),
                                              args=bwd.grad_graph_info.inputs_dict(info))
                ops.host_store(dx_out, dx)
    ir.num_host_transfers = steps
    rng = np.random.default_rng(2)
    xs, dys = (rng.normal(size=(steps, B, D)).astype(np.float32) for _ in range(2))
    outs, data = _session_run(ir, {x_in: xs, dy_in: dys}, [y_out, dx_out], accums.tensors)
    return outs, {t.name: v for t, v in data.items()}


@pytest.mark.parametrize("io_mode", ["compute", "io_overlapped"])
def test_fwd_and_grad_equal_plain(io_mode):
    steps = 3
    (y_bs, dx_bs), acc_bs = _fwd_and_grad(True, steps, io_mode)
    (y_p, dx_p), acc_p = _fwd_and_grad(False, steps)
    assert y_bs.tobytes() == y_p.tobytes() and dx_bs.tobytes() == dx_p.tobytes()
    assert sorted(acc_bs) == sorted(acc_p)
    for k in acc_bs:
        assert acc_bs[k].tobytes() == acc_p[k].tobytes(), k
    assert float(acc_bs["mean_accum_counter"]) == steps


def test_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Affine().create_graph(popxl.TensorSpec((B, D), popxl.float32))
        dfacts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        x_t = fwd.graph.inputs[0]
        wrong = popxl.h2d_stream((B, D + 1), popxl.float32, "wrong")
        with pytest.raises(ValueError, match="does not match input"):
            addons.batch_serialise(fwd, 2, {x_t: wrong}, {}, {}, io_mode="compute")
        with pytest.raises(ValueError, match="is not an input of graph"):
            addons.batch_serialise(fwd, 2, {bwd.graph.inputs[0]: wrong}, {}, {},
                                   io_mode="compute")
        small = popxl.remote_buffer((D,), popxl.float32, 2)
        with pytest.raises(ValueError, match="holds"):
            addons.batch_serialise(fwd, 2, {x_t: (small, 0)}, {}, {}, io_mode="compute")
        with pytest.raises(TypeError, match="RemoteHandle or a tuple"):
            addons.batch_serialise(fwd, 2, {x_t: "buffer"}, {}, {}, io_mode="compute")
        with pytest.raises(ValueError, match="steps must be an int >= 1"):
            addons.batch_serialise(fwd, 0, {}, {}, {}, io_mode="compute")
        with pytest.raises(ValueError, match="needs a load handle"):
            addons.batch_serialise_fwd_and_grad(fwd, bwd, fwd.args, 2, {}, {}, {},
                                                io_mode="compute")
        with pytest.raises(ValueError, match="is not the gradient graph"):
            addons.batch_serialise_fwd_and_grad(bwd, bwd, fwd.args, 2, {}, {}, {},
                                                io_mode="compute")


# --- a recomputed gradient of a seeded forward (the apps' phased layers) ----------------------
P_DROP = 0.5


class DropAffine(addons.Module):
    """y = dropout(x * w + b, seed): the gradient needs the forward's seed (for the mask)."""

    def build(self, x: popxl.Tensor, seed: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.random.normal, 0, 1, (D,)), popxl.float32)
        b = self.add_variable_input("b", partial(np.random.normal, 0, 1, (D,)), popxl.float32)
        return ops.dropout(x * w + b, seed, P_DROP)


def _seeded_fwd_and_grad(scheme: str, steps: int, io_mode: str = "compute",
                         recompute: bool = True):
    """`scheme`: "serialised" (batch_serialise_fwd_and_grad, of a `recompute_graph` gradient
    with `recompute`; the gradient called without a seed, as the apps do) or "plain" (the same
    steps, one call each, the gradient fed the forward's activations)."""
    np.random.seed(11)
    ir = popxl.Ir()
    _io_tiles(ir)
    with ir.main_graph, popxl.in_sequence(True):
        facts, fwd = DropAffine().create_graph(popxl.TensorSpec((B, D), popxl.float32),
                                               popxl.TensorSpec((2,), popxl.uint32))
        x_t, seed_t = fwd.graph.inputs[:2]
        dfacts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors,
                                                        grads_required=[x_t])
        x_in = popxl.h2d_stream((B, D), popxl.float32, "x")
        dy_in = popxl.h2d_stream((B, D), popxl.float32, "dy")
        y_out = popxl.d2h_stream((B, D), popxl.float32, "y")
        dx_out = popxl.d2h_stream((B, D), popxl.float32, "dx")
        weights = facts.init()
        accums = dfacts.init()
        seed = popxl.variable(popxl.create_seeds(5), popxl.uint32, "seed")
        # outputs[0]: y (the others: activations autodiff stashed, as upstream)
        y_t, dy_t, (dx_t,) = fwd.graph.outputs[0], bwd.graph.inputs[0], bwd.graph.outputs
        if scheme == "serialised":
            if recompute:
                bwd = addons.recompute_graph(bwd)
                dy_t, (dx_t,) = bwd.graph.inputs[0], bwd.graph.outputs
            f_res, g_res = addons.batch_serialise_fwd_and_grad(
                fwd, bwd, fwd.args, steps, {x_t: x_in, dy_t: dy_in}, {y_t: y_out, dx_t: dx_out},
                {}, seed_input=seed_t, io_mode=io_mode)
            # The per-step seed is kept like any other activation: stored by the forward
            # loop, loaded by the gradient loop, which takes no seed of its own.
            assert seed_t in f_res.stored_buffers
            assert [t.name for t in g_res.graph.graph.inputs[:1]] == ["batch_serial_loop_index"]
            assert all(t.dtype != popxl.uint32 for t in g_res.graph.graph.inputs)
            f_res.graph.bind(weights).call(0, seed)
            grad_args = accums.copy()
            grad_args.update(weights)
            g_res.graph.bind(grad_args).call(0)
        else:
            infos = []
            for _ in range(steps):
                step_seed, seed = ops.split_random_seed(seed)
                info = fwd.bind(weights).call_with_info(ops.host_load(x_in), step_seed)
                ops.host_store(y_out, info.outputs[0])
                infos.append(info)
            for info in infos:
                (dx,) = bwd.bind(accums).call(ops.host_load(dy_in),
                                              args=bwd.grad_graph_info.inputs_dict(info))
                ops.host_store(dx_out, dx)
    ir.num_host_transfers = steps
    rng = np.random.default_rng(2)
    xs, dys = (rng.normal(size=(steps, B, D)).astype(np.float32) for _ in range(2))
    outs, data = _session_run(ir, {x_in: xs, dy_in: dys}, [y_out, dx_out],
                              [*accums.tensors, *weights.tensors])
    return xs, dys, outs, {t.name: v for t, v in data.items()}


@pytest.mark.parametrize("io_mode,recompute", [("compute", True), ("io_overlapped", True),
                                               ("compute", False)])
def test_seeded_gradient_serialised_equals_plain_and_numpy(io_mode, recompute):
    steps = 3
    xs, dys, (y_bs, dx_bs), acc_bs = _seeded_fwd_and_grad("serialised", steps, io_mode,
                                                          recompute)
    _, _, (y_p, dx_p), acc_p = _seeded_fwd_and_grad("plain", steps)
    assert y_bs.tobytes() == y_p.tobytes() and dx_bs.tobytes() == dx_p.tobytes()
    for k in ("accum.w", "accum.b", "mean_accum_counter"):
        assert acc_bs[k].tobytes() == acc_p[k].tobytes(), k
    # NumPy: the masks (read off y: a kept element is (x*w+b)/(1-p), never exactly 0 here)
    # differ between steps, and give the gradients.
    w, b = acc_bs["w"], acc_bs["b"]
    pre = xs * w + b
    keep = y_bs != 0
    assert not np.array_equal(keep[0], keep[1])
    np.testing.assert_allclose(y_bs, np.where(keep, pre / (1 - P_DROP), 0), rtol=1e-6)
    dpre = np.where(keep, dys / (1 - P_DROP), 0)
    np.testing.assert_allclose(dx_bs, dpre * w, rtol=1e-6)
    np.testing.assert_allclose(acc_bs["accum.w"], (dpre * xs).sum(1).mean(0), rtol=1e-5)
    np.testing.assert_allclose(acc_bs["accum.b"], dpre.sum(1).mean(0), rtol=1e-5)
