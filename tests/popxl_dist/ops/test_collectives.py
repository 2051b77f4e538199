"""popxl.ops.collectives through a replicated Session (local backend, in-process): every function
and op against NumPy references computed per group from the per-replica inputs, groupings with
stride 1 and > 1 and group size 1, float16 / int32 / uint32 / bool, gradients of all_gather /
replicated_slice / replica_sharded_slice through autodiff, names, op types and build errors."""
from __future__ import annotations

import pickle

import numpy as np
import popxl
import pytest
from popxl import ops

C = ops.collectives
F16, F32, I32, U32, BOOL = np.float16, np.float32, np.int32, np.uint32, np.bool_


# --- references ----------------------------------------------------------------------------
def members(r: int, stride: int, size: int) -> list[int]:
    """Replicas of r's group, ascending: same block of stride*size, same offset mod stride."""
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


def ref_reduce(vals: np.ndarray, op: str) -> np.ndarray:
    """Reduce the members' values (axis 0, ascending order); float16 in float32, rounded once."""
    dt = vals.dtype
    calc = np.dtype(F32) if dt == F16 else dt
    acc = None
    for v in vals.astype(calc):
        v = v * v if op == "square_add" else v
        if acc is None:
            acc = v.copy()
        elif op in ("add", "mean", "square_add"):
            acc = acc + v
        elif op == "mul":
            acc = acc * v
        elif op == "min":
            acc = np.minimum(acc, v)
        elif op == "max":
            acc = np.maximum(acc, v)
        elif op == "and":
            acc = np.logical_and(acc, v)
        elif op == "or":
            acc = np.logical_or(acc, v)
    if op == "mean":
        acc = acc / calc.type(len(vals)) if calc.kind == "f" else acc // len(vals)
    return acc.astype(dt)


def assert_close(got, want, what=""):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind == "f":
        tol = 1e-3 if want.dtype == F16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def data(R: int, shape, dtype, seed: int, nonneg: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == BOOL:
        return rng.random((R, *shape)) < 0.5
    if np.dtype(dtype).kind in "iu":
        lo = 0 if (nonneg or dtype == U32) else -3
        return rng.integers(lo, 4, size=(R, *shape)).astype(dtype)
    return rng.normal(size=(R, *shape)).astype(dtype)


# --- running programs ----------------------------------------------------------------------
def run_replicated(R: int, build, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Build a main graph with one host_load per input (host layout (R, *shape)); `build(ir, ts)`
    returns {name: tensor} to host_store. Returns {name: (R, *shape) array}."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        streams = {k: popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype), k)
                   for k, a in inputs.items()}
        ts = {k: ops.host_load(s, k) for k, s in streams.items()}
        outs = build(ir, ts)
        d2h = {}
        for k, t in outs.items():
            d2h[k] = popxl.d2h_stream(t.shape, t.dtype, f"out_{k}")
            ops.host_store(d2h[k], t)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({streams[k]: a for k, a in inputs.items()})
    return {k: res[s] for k, s in d2h.items()}


# (R, stride, group_size); None = default group (all replicas)
GROUPINGS = [(2, None, None), (2, 1, 1), (4, None, None), (4, 1, 2), (4, 2, 2), (4, 1, 1),
             (8, None, None), (8, 1, 2), (8, 2, 2), (8, 2, 4), (8, 4, 2), (8, 1, 1)]
GIDS = [f"R{R}-all" if s is None else f"R{R}-s{s}-k{k}" for R, s, k in GROUPINGS]


def group_and_params(ir, R, s, k):
    if s is None:
        return None, 1, R
    return ir.replica_grouping(s, k), ir.replica_grouping(s, k).stride, k


REDUCE_CASES = [("add", F32), ("add", F16), ("add", I32), ("add", U32), ("mean", F32),
                ("mean", F16), ("mean", "i32pos"), ("min", F32), ("min", I32), ("max", F16),
                ("max", U32), ("mul", F32), ("mul", I32), ("square_add", F32),
                ("square_add", F16), ("square_add", I32), ("and", BOOL), ("or", BOOL)]


def _inputs(R: int, shape=(3, 5)) -> dict[str, np.ndarray]:
    return {"f32": data(R, shape, F32, 0), "f16": data(R, shape, F16, 1),
            "i32": data(R, shape, I32, 2), "u32": data(R, shape, U32, 3),
            "i32pos": data(R, shape, I32, 4, nonneg=True), "bool": data(R, shape, BOOL, 5)}


def _key(dt) -> str:
    return dt if isinstance(dt, str) else {F32: "f32", F16: "f16", I32: "i32", U32: "u32",
                                           BOOL: "bool"}[dt]


# --- all-reduce ----------------------------------------------------------------------------
@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_all_reduce_every_op_and_dtype(R, s, k):
    ins = _inputs(R)

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        return {f"{op}-{_key(dt)}": C.replicated_all_reduce(ts[_key(dt)], op, g)
                for op, dt in REDUCE_CASES}

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    for op, dt in REDUCE_CASES:
        x = ins[_key(dt)]
        for r in range(R):
            want = ref_reduce(x[members(r, stride, size)], op)
            assert_close(outs[f"{op}-{_key(dt)}"][r], want, f"{op} {_key(dt)} replica {r}")


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_all_reduce_inplace_modifies_its_input(R, s, k):
    ins = _inputs(R)

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        x = ts["f32"] * 1.0            # a fresh tensor (host_load data is read-only)
        y = C.replicated_all_reduce_(x, "mean", g)
        z = ts["i32"] + 0
        C.replicated_all_reduce_(z, "add", g)
        return {"x": x, "y": y, "z": z}

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    for r in range(R):
        mem = members(r, stride, size)
        want = ref_reduce(ins["f32"][mem], "mean")
        assert_close(outs["x"][r], want, "x after all_reduce_")
        assert_close(outs["y"][r], want, "all_reduce_ result")
        assert_close(outs["z"][r], ref_reduce(ins["i32"][mem], "add"), "z after all_reduce_")


# --- reduce-scatter ------------------------------------------------------------------------
RS_CASES = [("add", F32), ("add", F16), ("mean", F32), ("max", I32), ("min", U32),
            ("mul", F32), ("square_add", F16), ("or", BOOL), ("local", F32), ("local", I32)]


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_reduce_scatter_every_op_chunks_and_padding(R, s, k):
    ins = _inputs(R)                   # 15 elements: zero-padded for k = 2, 4, 8

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        out = {}
        for op, dt in RS_CASES:
            out[f"{op}-{_key(dt)}"] = C.replicated_reduce_scatter(ts[_key(dt)], op, g)
        out["rts"] = C.replicated_reduce_scatter(
            ts["f32"], "add", g, configure_output_for_replicated_tensor_sharding=True)
        out["sharded"] = C.replica_sharded_slice(ts["f16"], g)
        return out

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    c = -(-15 // size)
    for name, op, dt in [(f"{op}-{_key(dt)}", op, dt) for op, dt in RS_CASES] + [
            ("rts", "add", F32), ("sharded", "local", F16)]:
        x = ins[_key(dt)]
        for r in range(R):
            mem = members(r, stride, size)
            full = (x[r] if op == "local" else ref_reduce(x[mem], op)).reshape(-1)
            padded = np.concatenate([full, np.zeros(c * size - 15, full.dtype)])
            i = mem.index(r)
            assert_close(outs[name][r], padded[i * c:(i + 1) * c], f"{name} replica {r}")


# --- all-gather ----------------------------------------------------------------------------
@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_all_gather_modes(R, s, k):
    ins = _inputs(R, (2, 3))

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        x, h, i = ts["f32"], ts["f16"], ts["i32"]
        return {"auto": C.replicated_all_gather(x, group=g),
                "concat0": C.replicated_all_gather(h, 0, g, "concat"),
                "concat1": C.replicated_all_gather(i, 1, g, "concat"),
                "concat-1": C.replicated_all_gather(x, -1, g, "concat"),
                "new_axis": C.replicated_all_gather(i, 0, g, "new_axis"),
                "u32": C.replicated_all_gather(ts["u32"], 0, g)}

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    for r in range(R):
        mem = members(r, stride, size)
        f, h, i = ins["f32"][mem], ins["f16"][mem], ins["i32"][mem]
        assert_close(outs["auto"][r], np.concatenate(list(f), 0), "auto")
        assert_close(outs["concat0"][r], np.concatenate(list(h), 0), "concat0")
        assert_close(outs["concat1"][r], np.concatenate(list(i), 1), "concat1")
        assert_close(outs["concat-1"][r], np.concatenate(list(f), -1), "concat-1")
        assert_close(outs["new_axis"][r], i, "new_axis")
        assert_close(outs["u32"][r], np.concatenate(list(ins["u32"][mem]), 0), "u32")


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_rts_round_trip_and_meta_shape_gather(R, s, k):
    ins = _inputs(R)

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        shard = C.replica_sharded_slice(ts["f32"], g)
        scattered = C.replicated_reduce_scatter(ts["f16"], "add", g, True)
        return {"rebuilt": C.replicated_all_gather(shard, group=g),
                "explicit": C.replicated_all_gather(shard, 0, g, "meta_shape"),
                "reduced": C.replicated_all_gather(scattered, group=g),
                "flat": C.replicated_all_gather(shard, 0, g, "concat")}

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    c = -(-15 // size)
    for r in range(R):
        mem = members(r, stride, size)
        # each member contributes its own chunk of its own input
        chunks = []
        for m in mem:
            flat = np.concatenate([ins["f32"][m].reshape(-1), np.zeros(c * size - 15, F32)])
            i = mem.index(m)
            chunks.append(flat[i * c:(i + 1) * c])
        flat_all = np.concatenate(chunks)
        assert_close(outs["flat"][r], flat_all, "flat")
        assert_close(outs["rebuilt"][r], flat_all[:15].reshape(3, 5), "rebuilt")
        assert_close(outs["explicit"][r], flat_all[:15].reshape(3, 5), "explicit")
        assert_close(outs["reduced"][r], ref_reduce(ins["f16"][mem], "add"), "reduced")


# --- replicated_slice ----------------------------------------------------------------------
@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_replicated_slice(R, s, k):
    ins = {"x": data(R, (8, 8, 2), F32, 7), "i": data(R, (2, 8), I32, 8)}

    def build(ir, ts):
        g, _, _ = group_and_params(ir, R, s, k)
        return {"a0": C.replicated_slice(ts["x"], 0, g),
                "a1": C.replicated_slice(ts["x"], 1, g),
                "a-1": C.replicated_slice(ts["i"], -1, g)}

    outs = run_replicated(R, build, ins)
    stride, size = (1, R) if s is None else (s, k)
    for r in range(R):
        i = members(r, stride, size).index(r)
        if size == 8:        # parts of one row: the axis dropped, as upstream
            assert_close(outs["a0"][r], ins["x"][r][i], "axis 0")
            assert_close(outs["a1"][r], np.moveaxis(ins["x"][r][:, i], 0, 1), "axis 1")
            continue
        assert_close(outs["a0"][r], np.split(ins["x"][r], size, axis=0)[i], "axis 0")
        assert_close(outs["a1"][r], np.split(ins["x"][r], size, axis=1)[i], "axis 1")
        assert_close(outs["a-1"][r], np.split(ins["i"][r], size, axis=-1)[i], "axis -1")


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_replicated_slice_of_size_one_drops_the_axis_as_upstream(axis):
    """A part of size 1 (the axis as long as the group): upstream drops the axis; for axis > 0
    its rearrangement then moves the remaining first dimension to `axis`."""
    R = 4
    shape = [3, 5, 2]
    shape[axis] = R
    ins = {"x": data(R, tuple(shape), F32, 9)}
    outs = run_replicated(R, lambda ir, ts: {"y": C.replicated_slice(ts["x"], axis)}, ins)
    for r in range(R):
        want = np.take(ins["x"][r], r, axis=axis)          # the axis dropped
        if axis:                                           # dim 0 moved to `axis` (clamped)
            want = np.moveaxis(want, 0, min(axis, want.ndim - 1))
        assert outs["y"][r].shape == want.shape
        assert_close(outs["y"][r], want, f"replica {r}")


def test_all_gather_of_single_rows_differentiates_to_the_rows_shape():
    """The gradient of a concat all-gather whose inputs have one row (its slice drops the
    axis) comes back in the input's shape."""
    R = 4
    x = data(R, (1, 3), F32, 10)
    dy = data(R, (R, 3), F32, 11)
    y, dx, _ = run_grad(R, lambda ir, t: C.replicated_all_gather(t, 0, None, "concat"), x, dy)
    for r in range(R):
        assert_close(y[r], np.concatenate([x[m] for m in range(R)]), "y")
        assert_close(dx[r], dy[r][r:r + 1], f"dx replica {r}")


# --- gradients -----------------------------------------------------------------------------
def run_grad(R: int, fwd, x: np.ndarray, dy: np.ndarray):
    """Per-replica (y, dx) of the subgraph `fwd(ir, x)` via popxl.transforms.autodiff."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        g = ir.create_graph(lambda t: fwd(ir, t),
                            popxl.TensorSpec(x.shape[1:], popxl.dtype.as_dtype(x.dtype)))
        bwd = popxl.transforms.autodiff(g)
        xs = popxl.h2d_stream(x.shape[1:], popxl.dtype.as_dtype(x.dtype), "x")
        ds = popxl.h2d_stream(dy.shape[1:], popxl.dtype.as_dtype(dy.dtype), "dy")
        info = ops.call_with_info(g, ops.host_load(xs, "x"))
        y = info.outputs[0]
        dx, = ops.call(bwd.graph, ops.host_load(ds, "dy"), inputs_dict=bwd.inputs_dict(info))
        ys, dxs = popxl.d2h_stream(y.shape, y.dtype, "y"), popxl.d2h_stream(dx.shape, dx.dtype,
                                                                              "dx")
        ops.host_store(ys, y)
        ops.host_store(dxs, dx)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({xs: x, ds: dy})
    return res[ys], res[dxs], bwd


GRAD_GROUPINGS = [(2, None, None), (4, 2, 2), (8, 1, 2), (8, 2, 4), (8, 4, 2), (4, 1, 1)]
GGIDS = [f"R{R}-all" if s is None else f"R{R}-s{s}-k{k}" for R, s, k in GRAD_GROUPINGS]


def _grp(ir, s, k):
    return None if s is None else ir.replica_grouping(s, k)


@pytest.mark.parametrize("R,s,k", GRAD_GROUPINGS, ids=GGIDS)
@pytest.mark.parametrize("mode,axis", [("concat", 0), ("concat", 1), ("new_axis", 0)])
def test_all_gather_grad_is_own_part_of_dy(R, s, k, mode, axis):
    stride, size = (1, R) if s is None else (s, k)
    x = data(R, (2, 3), F32, 10)
    out_shape = (size, 2, 3) if mode == "new_axis" else ((2 * size, 3) if axis == 0
                                                         else (2, 3 * size))
    dy = data(R, out_shape, F32, 11)
    _y, dx, _ = run_grad(R, lambda ir, t: C.replicated_all_gather(t, axis, _grp(ir, s, k), mode),
                        x, dy)
    for r in range(R):
        i = members(r, stride, size).index(r)
        part = dy[r][i] if mode == "new_axis" else np.split(dy[r], size, axis=axis)[i]
        assert_close(dx[r], part, f"dx replica {r}")


@pytest.mark.parametrize("R,s,k", GRAD_GROUPINGS, ids=GGIDS)
def test_meta_shape_all_gather_grad_is_own_shard_of_dy(R, s, k):
    stride, size = (1, R) if s is None else (s, k)
    x = data(R, (3, 5), F32, 12)
    dy = data(R, (3, 5), F32, 13)
    c = -(-15 // size)

    def fwd(ir, t):
        return C.replicated_all_gather(C.replica_sharded_slice(t, _grp(ir, s, k)),
                                       group=_grp(ir, s, k)) * 1.0

    # d(gather(shard(x)))/dx: own shard of dy, then gathered back (the shard's grad gathers)
    _y, dx, _ = run_grad(R, fwd, x, dy)
    for r in range(R):
        mem = members(r, stride, size)
        shards = []
        for m in mem:
            flat = np.concatenate([dy[m].reshape(-1), np.zeros(c * size - 15, F32)])
            i = mem.index(m)
            shards.append(flat[i * c:(i + 1) * c])
        assert_close(dx[r], np.concatenate(shards)[:15].reshape(3, 5), f"dx replica {r}")


def test_meta_shape_gather_of_an_over_long_shard_and_its_grad():
    """A shard of 4 elements with meta_shape (5,) gathered over 2 replicas: the flat gather (8)
    is truncated to 5; the grad pads dy to 8 and takes this replica's 4."""
    R = 4
    x = data(R, (4,), F32, 21)
    dy = data(R, (5,), F32, 22)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(2, 2)
        g = ir.create_graph(lambda t: C.replicated_all_gather(t, group=rg),
                            popxl.TensorSpec((4,), popxl.float32, (5,)))
        bwd = popxl.transforms.autodiff(g)
        xs, ds = popxl.h2d_stream((4,), popxl.float32, "x"), popxl.h2d_stream((5,), popxl.float32,
                                                                              "dy")
        info = ops.call_with_info(g, ops.host_load(xs))
        dx, = ops.call(bwd.graph, ops.host_load(ds), inputs_dict=bwd.inputs_dict(info))
        ys, dxs = popxl.d2h_stream((5,), popxl.float32, "y"), popxl.d2h_stream((4,),
                                                                               popxl.float32, "dx")
        ops.host_store(ys, info.outputs[0])
        ops.host_store(dxs, dx)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({xs: x, ds: dy})
    for r in range(R):
        mem = members(r, 2, 2)
        i = mem.index(r)
        assert_close(res[ys][r], np.concatenate([x[m] for m in mem])[:5], "y")
        assert_close(res[dxs][r], np.concatenate([dy[r], np.zeros(3, F32)])[i * 4:(i + 1) * 4],
                     "dx")


@pytest.mark.parametrize("R,s,k", GRAD_GROUPINGS, ids=GGIDS)
def test_replica_sharded_slice_grad_gathers_dy(R, s, k):
    stride, size = (1, R) if s is None else (s, k)
    x = data(R, (3, 5), F32, 14)
    c = -(-15 // size)
    dy = data(R, (c,), F32, 15)
    _y, dx, _ = run_grad(R, lambda ir, t: C.replica_sharded_slice(t, _grp(ir, s, k)), x, dy)
    for r in range(R):
        mem = members(r, stride, size)
        want = np.concatenate([dy[m] for m in mem])[:15].reshape(3, 5)
        assert_close(dx[r], want, f"dx replica {r}")


@pytest.mark.parametrize("R,s,k", GRAD_GROUPINGS, ids=GGIDS)
@pytest.mark.parametrize("axis", [0, 1])
def test_replicated_slice_grad_gathers_dy(R, s, k, axis):
    stride, size = (1, R) if s is None else (s, k)
    x = data(R, (8, 8), F32, 16)
    part = (8 // size, 8) if axis == 0 else (8, 8 // size)
    dy = data(R, part, F32, 17)
    y, dx, _ = run_grad(R, lambda ir, t: C.replicated_slice(t, axis, _grp(ir, s, k)), x, dy)
    for r in range(R):
        mem = members(r, stride, size)
        i = mem.index(r)
        assert_close(y[r], np.split(x[r], size, axis=axis)[i], "y")
        assert_close(dx[r], np.concatenate([dy[m] for m in mem], axis=axis), f"dx replica {r}")


def test_all_reduce_has_no_gradient():
    R = 4
    x = data(R, (2, 3), F32, 18)
    dy = data(R, (2, 3), F32, 19)
    y, dx, bwd = run_grad(R, lambda ir, t: C.replicated_all_reduce(t) + t, x, dy)
    for r in range(R):
        assert_close(y[r], x.sum(axis=0) + x[r], "y")
        assert_close(dx[r], dy[r], "dx: only the identity path carries a gradient")
    types = [op.type for op in bwd.graph._data.ops]
    assert not any(t.startswith("Replicated") for t in types), types


def test_non_local_reduce_scatter_grad_raises():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        g = ir.create_graph(lambda t: C.replicated_reduce_scatter(t, "add"),
                            popxl.TensorSpec((4,), popxl.float32))
        with pytest.raises(NotImplementedError, match="local"):
            popxl.transforms.autodiff(g)


def test_grad_graph_op_types():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        rg = ir.replica_grouping(2, 2)
        g = ir.create_graph(lambda t: C.replicated_all_gather(t, 0, rg),
                            popxl.TensorSpec((2, 3), popxl.float32))
        bwd = popxl.transforms.autodiff(g)
        rs = [op for op in bwd.graph._data.ops if op.type == "ReplicatedReduceScatter"]
        assert len(rs) == 1 and rs[0].attrs["op"] == "local"
        assert (rs[0].attrs["stride"], rs[0].attrs["group_size"]) == (2, 2)
        g2 = ir.create_graph(lambda t: C.replica_sharded_slice(t, rg),
                             popxl.TensorSpec((5,), popxl.float32))
        bwd2 = popxl.transforms.autodiff(g2)
        ag = [op for op in bwd2.graph._data.ops if op.type == "ReplicatedAllGather"]
        assert len(ag) == 1 and (ag[0].attrs["stride"], ag[0].attrs["group_size"]) == (2, 2)


# --- names, op types, attributes -----------------------------------------------------------
def test_names_types_shapes_and_plain_attrs():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x = popxl.variable(np.zeros((3, 5), F32), name="x")
        rg = ir.replica_grouping(2, 2)
        a = C.replicated_all_reduce(x, "mean", rg)
        b = C.replicated_all_reduce_(x, "add")
        c = C.replicated_reduce_scatter(x, "add", rg)
        d = C.replicated_reduce_scatter(x, "max", None, True)
        e = C.replica_sharded_slice(x)
        f = C.replicated_all_gather(e)
        h = C.replicated_all_gather(x, 1, rg)
        n = C.replicated_all_gather(x, 0, rg, "new_axis")
    assert a.name == "x_all_reduce" and b.name.startswith("x_all_reduce")
    assert c.name == "x_reduce_scattered" and e.name.startswith("x_reduce_scattered")
    assert f.name == e.name + "_all_gathered" and h.name == "x_all_gathered"
    assert a.shape == (3, 5) and b.shape == (3, 5)
    assert c.shape == (8,) and c.meta_shape == ()
    assert d.shape == (4,) and d.meta_shape == (3, 5)
    assert e.shape == (4,) and e.meta_shape == (3, 5)
    assert f.shape == (3, 5) and h.shape == (3, 10) and n.shape == (2, 3, 5)
    ops_ = ir.main_graph._data.ops
    types = [op.type for op in ops_]
    assert types == ["ReplicatedAllReduce", "ReplicatedAllReduceInplace",
                     "ReplicatedReduceScatter", "ReplicatedReduceScatter",
                     "ReplicatedReduceScatter", "ReplicatedAllGather", "ReplicatedAllGather",
                     "ReplicatedAllGather"]
    assert ops_[0].attrs == {"op": "mean", "stride": 2, "group_size": 2}
    assert ops_[1].attrs == {"op": "add", "stride": 1, "group_size": 4}
    assert ops_[3].attrs["rts"] is True and ops_[4].attrs["op"] == "local"
    assert ops_[7].attrs["mode"] == "new_axis"
    assert ops_[5].attrs["mode"] == "meta_shape" and ops_[6].attrs["mode"] == "concat"
    for op in ops_:
        assert all(isinstance(v, (int, str, bool)) for v in op.attrs.values()), op.attrs
        pickle.dumps(op.attrs)


def test_replicated_slice_builds_transpose_reshape_local_reduce_scatter():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((3, 4), F32), name="x")
        y = C.replicated_slice(x, 1)
    assert y.shape == (3, 2)
    types = [op.type for op in ir.main_graph._data.ops]
    assert types == ["Transpose", "Reshape", "ReplicatedReduceScatter", "Reshape", "Transpose"]
    assert ir.main_graph._data.ops[2].attrs["op"] == "local"


def test_mul_is_a_product_not_mean():
    R = 4
    x = data(R, (5,), F32, 20)
    outs = run_replicated(R, lambda ir, ts: {"m": C.replicated_all_reduce(ts["x"], "mul")},
                          {"x": x})
    assert_close(outs["m"][0], np.prod(x, axis=0), "mul")


def test_comm_group_legacy_exports():
    cg = C.CommGroup(C.CommGroupType.Orthogonal, 2)
    assert cg.type == C.CommGroupType.Orthogonal and cg.replicaGroupSize == 2
    assert C.CommGroup() == C.CommGroup(C.CommGroupType.All, 0)
    assert {t.name for t in C.CommGroupType} == {"All", "Consecutive", "Orthogonal",
                                                 "Ungrouped"}
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((2,), F32))
        with pytest.raises(TypeError, match="ReplicaGrouping"):
            C.replicated_all_reduce(x, "add", cg)


# --- errors --------------------------------------------------------------------------------
@pytest.fixture
def ir4():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        yield ir


def test_bad_op_string(ir4):
    x = popxl.variable(np.zeros((4,), F32), name="x")
    with pytest.raises(ValueError, match="^Not a valid op: sum. Must choose from: add, mean, "
                                         "mul, min, max, and, or, square_add, local"):
        C.replicated_all_reduce(x, "sum")
    with pytest.raises(ValueError, match="valid ops"):
        C.replicated_all_reduce(x, "local")       # local is for the reduce-scatter family only
    with pytest.raises(ValueError, match="^Not a valid op: prod"):
        C.replicated_reduce_scatter(x, "prod")
    with pytest.raises(ValueError, match="^output_shape must equal one of 'new_axis', 'concat', "
                                         "'meta_shape', 'auto'. Value: stack"):
        C.replicated_all_gather(x, 0, None, "stack")
    # a grouping passed where the axis goes (upstream's check)
    with pytest.raises(ValueError, match="^Axis should be an int. Type: <class "
                                         "'popxl.replica_grouping.ReplicaGrouping'>"):
        C.replicated_all_gather(x, ir4.replica_grouping(group_size=2))


def test_bad_dtypes(ir4):
    d = popxl.variable(np.zeros((4,), np.float64), popxl.float64, name="d", downcast=False)
    u8 = popxl.variable(np.zeros((4,), np.uint8), name="u8")
    b = popxl.variable(np.zeros((4,), BOOL), name="b")
    f = popxl.variable(np.zeros((4,), F32), name="f")
    with pytest.raises(TypeError, match="float64"):
        C.replicated_all_reduce(d)
    with pytest.raises(TypeError, match="float64"):
        C.replicated_all_gather(d)
    with pytest.raises(TypeError, match="float64"):
        C.replica_sharded_slice(d)
    with pytest.raises(TypeError, match="uint8"):
        C.replicated_reduce_scatter(u8, "max")
    with pytest.raises(TypeError, match="bool"):
        C.replicated_all_reduce(b, "add")
    with pytest.raises(TypeError, match="bool"):
        C.replicated_all_reduce(f, "and")
    with pytest.raises(TypeError, match="Tensor"):
        C.replicated_all_reduce(np.zeros(4, F32))


def test_replicated_slice_not_divisible(ir4):
    x = popxl.variable(np.zeros((6, 4), F32), name="x")
    with pytest.raises(ValueError, match="^Replicated slice must equally divide axis. Axis "
                                         "size: 6. Replica group size: 4"):
        C.replicated_slice(x, 0)                  # 6 rows over 4 replicas
    with pytest.raises(ValueError, match="out of range"):
        C.replicated_slice(x, 2)
    assert C.replicated_slice(x, 1).shape == (6,)            # a part of size 1: axis dropped
    assert C.replicated_slice(x, 0, ir4.replica_grouping(2, 2)).shape == (3, 4)


def test_foreign_and_non_constant_groupings(ir4):
    x = popxl.variable(np.zeros((4,), F32), name="x")
    other = popxl.Ir(replication=4)
    with pytest.raises(ValueError, match="another Ir"):
        C.replicated_all_reduce(x, "add", other.replica_grouping(2, 2))
    odd = ir4.replica_grouping_from_assignments([0, 1, 1, 0])
    assert not odd.is_const
    for fn in (lambda: C.replicated_all_reduce(x, "add", odd),
               lambda: C.replicated_reduce_scatter(x, "add", odd),
               lambda: C.replicated_all_gather(x, 0, odd),
               lambda: C.replicated_slice(x, 0, odd)):
        with pytest.raises(NotImplementedError, match="cannot be used in collectives"):
            fn()                                # as upstream (no GCL form)


def test_meta_shape_mode_needs_meta_shape(ir4):
    x = popxl.variable(np.zeros((4,), F32), name="x")
    with pytest.raises(ValueError, match="meta_shape"):
        C.replicated_all_gather(x, 0, None, "meta_shape")
    with pytest.raises(ValueError, match="out of range"):
        C.replicated_all_gather(x, 1, None, "concat")
