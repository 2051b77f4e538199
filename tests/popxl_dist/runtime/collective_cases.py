"""Self-checking collective cases, run unchanged under every backend.

    python collective_cases.py                         # local backend (in-process)
    popxl-run --backend mpi --workers 2 collective_cases.py
    popxl-run --backend ray --workers 2 collective_cases.py

Builds a few Irs (R = 2, 4, 8) with many collective ops each (every op type and function,
groupings with stride 1 and > 1 and group size 1, float32 / float16 / int32 / uint32 / bool, and
gradients through autodiff), runs them through `popxl.Session`, compares every replica's output
with NumPy references computed here from the per-replica inputs, and prints one line per case:
`ok <case>` or `FAIL <case>: <details>`. Exit status 1 if any case failed, else 0.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import numpy as np
import popxl
from popxl import ops

C = ops.collectives
F16, F32, I32, U32, BOOL = np.float16, np.float32, np.int32, np.uint32, np.bool_
SHAPE = (3, 5)          # 15 elements: reduce-scatter pads for group sizes 2, 4 and 8

# (stride, group_size) per replication factor; None = the default grouping (all replicas)
GROUPINGS = {2: [None, (1, 1)],
             4: [None, (1, 2), (2, 2), (1, 1)],
             8: [None, (1, 2), (2, 2), (2, 4), (4, 2), (1, 1)]}


# --- references ----------------------------------------------------------------------------
def members(r: int, stride: int, size: int) -> list[int]:
    """r's group, ascending: the same block of stride*size replicas, same offset mod stride."""
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


def ref_reduce(vals: np.ndarray, op: str) -> np.ndarray:
    """Reduce members' values in ascending order; float16 accumulates in float32."""
    dt = vals.dtype
    calc = np.dtype(F32) if dt == F16 else dt
    acc = None
    for v in vals.astype(calc):
        v = v * v if op == "square_add" else v
        if acc is None:
            acc = v.copy()
            continue
        acc = {"add": np.add, "mean": np.add, "square_add": np.add, "mul": np.multiply,
               "min": np.minimum, "max": np.maximum, "and": np.logical_and,
               "or": np.logical_or}[op](acc, v)
    if op == "mean":
        acc = acc / calc.type(len(vals)) if calc.kind == "f" else acc // len(vals)
    return acc.astype(dt)


def chunk(flat: np.ndarray, i: int, k: int) -> np.ndarray:
    """Chunk i of `flat` zero-padded to k*ceil(n/k)."""
    c = -(-flat.size // k)
    padded = np.concatenate([flat, np.zeros(c * k - flat.size, flat.dtype)])
    return padded[i * c:(i + 1) * c]


def compare(got: np.ndarray, want: np.ndarray) -> str:
    """'' if equal (floats within one float16 / a few float32 ulps), else a description."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    if want.dtype.kind == "f":
        tol = 1e-3 if want.dtype == F16 else 1e-6
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    if ok:
        return ""
    return f"max |diff| {np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))}"


def make_inputs(R: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"f32": rng.normal(size=(R, *SHAPE)).astype(F32),
            "f16": rng.normal(size=(R, *SHAPE)).astype(F16),
            "i32": rng.integers(-3, 4, size=(R, *SHAPE)).astype(I32),
            "pos": rng.integers(0, 9, size=(R, *SHAPE)).astype(I32),
            "u32": rng.integers(0, 4, size=(R, *SHAPE)).astype(U32),
            "bool": rng.random((R, *SHAPE)) < 0.5,
            "sq": rng.normal(size=(R, 8, 8)).astype(F32)}


# A case: (name, build(ts, group) -> Tensor, ref(ins, r, members, index) -> array)
Case = tuple[str, Callable, Callable]


def _all_reduce_case(op: str, key: str) -> Case:
    return (f"all_reduce[{op},{key}]",
            lambda ts, g: C.replicated_all_reduce(ts[key], op, g),
            lambda ins, r, mem, i: ref_reduce(ins[key][mem], op))


def _reduce_scatter_case(op: str, key: str, rts: bool = False) -> Case:
    def ref(ins, r, mem, i):
        full = ins[key][r] if op == "local" else ref_reduce(ins[key][mem], op)
        return chunk(full.reshape(-1), i, len(mem))
    return (f"reduce_scatter[{op},{key}{',rts' if rts else ''}]",
            lambda ts, g: C.replicated_reduce_scatter(ts[key], op, g, rts), ref)


def _inplace(ts, g):
    x = ts["f32"] * 1.0
    C.replicated_all_reduce_(x, "mean", g)
    return x


def _rts_round_trip(ts, g):
    return C.replicated_all_gather(C.replica_sharded_slice(ts["f16"], g), group=g)


def _rts_ref(ins, r, mem, i):
    k = len(mem)
    own = [chunk(ins["f16"][m].reshape(-1), j, k) for j, m in enumerate(mem)]
    return np.concatenate(own)[:15].reshape(SHAPE)


CASES: list[Case] = [
    *[_all_reduce_case(op, key) for op, key in [
        ("add", "f32"), ("add", "f16"), ("add", "i32"), ("add", "u32"), ("mean", "f32"),
        ("mean", "f16"), ("mean", "pos"), ("min", "f32"), ("max", "i32"), ("mul", "f32"),
        ("mul", "i32"), ("square_add", "f16"), ("square_add", "i32"), ("and", "bool"),
        ("or", "bool")]],
    ("all_reduce_[mean,f32]", _inplace, lambda ins, r, mem, i: ref_reduce(ins["f32"][mem], "mean")),
    *[_reduce_scatter_case(op, key) for op, key in [
        ("add", "f32"), ("add", "f16"), ("mean", "f32"), ("max", "i32"), ("min", "u32"),
        ("mul", "f32"), ("square_add", "f32"), ("or", "bool"), ("local", "i32")]],
    _reduce_scatter_case("add", "f16", rts=True),
    ("replica_sharded_slice[f32]", lambda ts, g: C.replica_sharded_slice(ts["f32"], g),
     lambda ins, r, mem, i: chunk(ins["f32"][r].reshape(-1), i, len(mem))),
    ("all_gather[meta_shape(rts round trip),f16]", _rts_round_trip, _rts_ref),
    ("all_gather[concat0,f32]", lambda ts, g: C.replicated_all_gather(ts["f32"], 0, g),
     lambda ins, r, mem, i: np.concatenate(list(ins["f32"][mem]), 0)),
    ("all_gather[concat1,i32]", lambda ts, g: C.replicated_all_gather(ts["i32"], 1, g),
     lambda ins, r, mem, i: np.concatenate(list(ins["i32"][mem]), 1)),
    ("all_gather[new_axis,u32]",
     lambda ts, g: C.replicated_all_gather(ts["u32"], 0, g, "new_axis"),
     lambda ins, r, mem, i: ins["u32"][mem]),
    ("replicated_slice[axis0,f32]", lambda ts, g: C.replicated_slice(ts["sq"], 0, g),
     lambda ins, r, mem, i: _slice_ref(ins["sq"][r], len(mem), 0, i)),
    ("replicated_slice[axis1,f32]", lambda ts, g: C.replicated_slice(ts["sq"], 1, g),
     lambda ins, r, mem, i: _slice_ref(ins["sq"][r], len(mem), 1, i)),
]


def _slice_ref(a: np.ndarray, k: int, axis: int, i: int) -> np.ndarray:
    """Part i of k of `a` along `axis`; a part of size 1 drops the axis (upstream's rule; for
    2-D data nothing moves)."""
    part = np.split(a, k, axis)[i]
    return np.squeeze(part, axis) if part.shape[axis] == 1 else part


# --- gradient cases ------------------------------------------------------------------------
def _grad_fwd(ir, x, s):
    """Forward graph body: y1 = all_gather(x) (concat axis 1), y2 = replicated_slice(x, 0),
    y3 = all_gather(replica_sharded_slice(x)) (meta_shape)."""
    g = ir.replica_grouping(*s) if s else None
    return (C.replicated_all_gather(x, 1, g, "concat"), C.replicated_slice(x, 0, g),
            C.replicated_all_gather(C.replica_sharded_slice(x, g), group=g))


def _grad_ref(x, dys, r, mem, i):
    """dx of the sum of the three outputs against dys."""
    k = len(mem)
    dx = np.split(dys[0][r], k, axis=1)[i]                                # gather: own part
    # slice: gathered (a part of one row has no axis 0: upstream drops a size-1 axis)
    dx = dx + np.concatenate([dys[1][m].reshape(-1, x.shape[2]) for m in mem], axis=0)
    shards = [chunk(dys[2][m].reshape(-1), j, k) for j, m in enumerate(mem)]
    return dx + np.concatenate(shards)[:x.shape[1] * x.shape[2]].reshape(x.shape[1:])


# --- runner --------------------------------------------------------------------------------
def run_forward(R: int, results: list[tuple[str, str]]) -> None:
    ins = make_inputs(R, seed=R)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        streams = {k: popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype), k)
                   for k, a in ins.items()}
        ts = {k: ops.host_load(s, k) for k, s in streams.items()}
        built = []
        for grouping in GROUPINGS[R]:
            g = ir.replica_grouping(*grouping) if grouping else None
            for name, build, ref in CASES:
                t = build(ts, g)
                d2h = popxl.d2h_stream(t.shape, t.dtype, f"out{len(built)}")
                ops.host_store(d2h, t)
                built.append((grouping, name, ref, d2h))
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({streams[k]: a for k, a in ins.items()})
    for grouping, name, ref, d2h in built:
        s, k = grouping or (1, R)
        errs = []
        for r in range(R):
            mem = members(r, s, k)
            err = compare(out[d2h][r], ref(ins, r, mem, mem.index(r)))
            if err:
                errs.append(f"replica {r}: {err}")
        results.append((f"R{R} {_gname(grouping)} {name}", "; ".join(errs[:3])))


def run_grads(R: int, results: list[tuple[str, str]]) -> None:
    rng = np.random.default_rng(100 + R)
    x = rng.normal(size=(R, 8, 8)).astype(F32)
    ir = popxl.Ir(replication=R)
    built = []
    feeds = {}
    with ir.main_graph:
        xs = popxl.h2d_stream((8, 8), popxl.float32, "x")
        xt = ops.host_load(xs, "x")
        feeds[xs] = x
        for gi, grouping in enumerate(GROUPINGS[R]):
            fwd = ir.create_graph(lambda t, s=grouping: _grad_fwd(ir, t, s),
                                  popxl.TensorSpec((8, 8), popxl.float32))
            bwd = popxl.transforms.autodiff(fwd)
            info = ops.call_with_info(fwd, xt)
            dys, dy_ts = [], []
            for j, y in enumerate(info.outputs[:3]):
                d = rng.normal(size=(R, *y.shape)).astype(F32)
                s = popxl.h2d_stream(y.shape, popxl.float32, f"dy{gi}_{j}")
                feeds[s] = d
                dys.append(d)
                dy_ts.append(ops.host_load(s, f"dy{gi}_{j}"))
            dx, = ops.call(bwd.graph, *dy_ts, inputs_dict=bwd.inputs_dict(info))
            out = popxl.d2h_stream(dx.shape, dx.dtype, f"dx{gi}")
            ops.host_store(out, dx)
            built.append((grouping, dys, out))
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run(feeds)
    for grouping, dys, out in built:
        s, k = grouping or (1, R)
        errs = []
        for r in range(R):
            mem = members(r, s, k)
            err = compare(res[out][r], _grad_ref(x, dys, r, mem, mem.index(r)))
            if err:
                errs.append(f"replica {r}: {err}")
        name = (f"R{R} {_gname(grouping)} "
                "autodiff[all_gather+replicated_slice+replica_sharded_slice]")
        results.append((name, "; ".join(errs[:3])))


def _gname(grouping) -> str:
    return "all" if grouping is None else f"stride{grouping[0]}-size{grouping[1]}"


def main() -> int:
    """Run every case; print `ok <case>` / `FAIL <case>: <details>`; 1 if any failed."""
    failed = 0
    for R in (2, 4, 8):
        for runner in (run_forward, run_grads):
            results: list[tuple[str, str]] = []
            try:
                runner(R, results)
            except Exception:  # noqa: BLE001 - reported as a failed case, the rest still run
                results.append((f"R{R} {runner.__name__}", traceback.format_exc()))
            for name, err in results:
                if err:
                    failed += 1
                    print(f"FAIL {name}: {err}")
                else:
                    print(f"ok {name}")
    print(f"{'FAILED' if failed else 'passed'}: {failed} failing case(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
