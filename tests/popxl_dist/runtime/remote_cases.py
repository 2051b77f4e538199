"""Self-checking remote buffer / remote variable / RTS cases, run unchanged under every backend.

    python remote_cases.py                             # local backend (in-process)
    popxl-run --backend mpi --workers 2 remote_cases.py
    popxl-run --backend ray --workers 2 remote_cases.py

For R = 2, 4 and 8 it builds a few Irs: per-replica store / load round trips with int and
runtime (streamed) offsets in float32 / float16 / int32 / uint32; remote variables with every
grouping and both retrieval modes (loaded, updated with replica-specific data, stored back, read
by the host, rewritten while attached); replica-sharded variables (padding, shard_over below the
group size, grouped) gathered, updated in place across runs, read back and rewritten; the
explicit `replica_sharded_buffer` path; the device memory report; an out-of-range offset error.
Every value is compared with NumPy references computed here. Prints `ok <case>` or
`FAIL <case>: <details>`; `main()` returns the number of failing cases (the exit status is
nonzero if any failed).
"""
from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Callable

import numpy as np
import popxl
from popxl import ops

C = ops.collectives
DTYPES = [np.float32, np.float16, np.int32, np.uint32]

# (stride, group_size) per replication factor; None = one group of all replicas
GROUPINGS = {2: [None, (1, 1)],
             4: [None, (1, 2), (2, 2), (1, 1)],
             8: [None, (1, 2), (2, 2), (2, 4), (4, 2)]}

# (grouping, shard_over or None, per-group shape) per replication factor
RTS = {2: [(None, None, (2, 5)), (None, None, (1,))],
       4: [(None, None, (10,)), (None, None, (3,)), (None, 2, (7,)), ((1, 2), None, (5,)),
           ((2, 2), None, (3, 3))],
       8: [(None, None, (10,)), (None, 4, (6,)), ((1, 4), 2, (5,)), ((2, 4), None, (9,)),
           ((4, 2), None, (2, 2))]}

Results = list[tuple[str, str]]


# --- references ----------------------------------------------------------------------------
def group_of(r: int, stride: int, size: int) -> int:
    return r % stride + stride * (r // (stride * size))


def members(r: int, stride: int, size: int) -> list[int]:
    """r's group, ascending."""
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


def chunk(value: np.ndarray, i: int, k: int) -> np.ndarray:
    """Chunk i of the flattened value zero-padded to k * ceil(n / k)."""
    flat = np.asarray(value).reshape(-1)
    c = -(-flat.size // k)
    return np.concatenate([flat, np.zeros(c * k - flat.size, flat.dtype)])[i * c:(i + 1) * c]


def compare(got: np.ndarray, want: np.ndarray) -> str:
    """'' if equal (floats within float16 / float32 rounding), else a description."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    if want.dtype.kind == "f":
        tol = 1e-3 if want.dtype == np.float16 else 1e-6
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    if ok:
        return ""
    return f"max |diff| {np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))}"


def rand(rng: np.random.Generator, shape, dt) -> np.ndarray:
    if np.dtype(dt).kind == "f":
        return rng.normal(size=shape).astype(dt)
    return rng.integers(0, 40, size=shape).astype(dt)


def _gname(grouping) -> str:
    return "all" if grouping is None else f"stride{grouping[0]}-size{grouping[1]}"


def _out(t, name: str):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


class Errors:
    """Collects per-case mismatches (the first few are reported)."""

    def __init__(self) -> None:
        self.by_case: dict[str, list[str]] = {}

    def check(self, case: str, what: str, got, want) -> None:
        err = compare(got, want)
        errs = self.by_case.setdefault(case, [])
        if err:
            errs.append(f"{what}: {err}")

    def report(self, results: Results) -> None:
        for case, errs in self.by_case.items():
            results.append((case, "; ".join(errs[:3])))


# --- cases -----------------------------------------------------------------------------------
def run_round_trip(R: int, results: Results) -> None:
    """Per dtype, per run: a = load(buf, i); store(buf, j, x); b = load(buf, j);
    store(buf, 2, a); c = load(buf, 2) with i, j streamed per replica."""
    E, shape = 3, (2, 3)
    ir = popxl.Ir(replication=R)
    built = []
    with ir.main_graph:
        i_s = popxl.h2d_stream((), popxl.uint32, "i")
        j_s = popxl.h2d_stream((), popxl.int32, "j")
        with popxl.in_sequence():
            i = ops.host_load(i_s, "i")
            j = ops.host_load(j_s, "j")
            for dt in DTYPES:
                pdt = popxl.dtype.as_dtype(dt)
                xs = popxl.h2d_stream(shape, pdt, f"x_{pdt.name}")
                buf = popxl.remote_buffer(shape, pdt, E)
                x = ops.host_load(xs)
                a = ops.remote_load(buf, i, f"a_{pdt.name}")
                ops.remote_store(buf, j, x)
                b = ops.remote_load(buf, j, f"b_{pdt.name}")
                ops.remote_store(buf, 2, a)
                c = ops.remote_load(buf, 2, f"c_{pdt.name}")
                built.append((dt, xs, [_out(t, t.name) for t in (a, b, c)]))
    rng = np.random.default_rng(R)
    mem = {dt: np.zeros((R, E) + shape, dt) for dt in DTYPES}
    errors = Errors()
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(3):
            i_v = rng.integers(0, E, R).astype(np.uint32)
            j_v = rng.integers(0, 2, R).astype(np.int32)
            feeds = {i_s: i_v, j_s: j_v}
            xs_v = {dt: rand(rng, (R,) + shape, dt) for dt in DTYPES}
            feeds.update({xs: xs_v[dt] for dt, xs, _ in built})
            got = sess.run(feeds)
            for dt, _, (oa, ob, oc) in built:
                case = f"R{R} store/load round trip[{np.dtype(dt).name}]"
                m = mem[dt]
                for r in range(R):
                    want_a = m[r, i_v[r]].copy()
                    m[r, j_v[r]] = xs_v[dt][r]
                    m[r, 2] = want_a
                    errors.check(case, f"run {step} replica {r} a", got[oa][r], want_a)
                    errors.check(case, f"run {step} replica {r} b", got[ob][r], xs_v[dt][r])
                    errors.check(case, f"run {step} replica {r} c", got[oc][r], want_a)
    errors.report(results)


def run_remote_variables(R: int, results: Results) -> None:
    """Per grouping and retrieval mode: x = load(buf, 1); store(buf, 1, x + d) with d per
    replica; the host reads the variables, then rewrites the one_per_group ones."""
    shape = (2, 3)
    rng = np.random.default_rng(10 + R)
    ir = popxl.Ir(replication=R)
    built = []
    with ir.main_graph:
        ds = popxl.h2d_stream(shape, popxl.float32, "d")
        d = ops.host_load(ds, "d")
        for grouping in GROUPINGS[R]:
            stride, size = grouping or (1, R)
            G = R // size
            rg = ir.replica_grouping(*grouping) if grouping else None
            for mode in ("one_per_group", "all_replicas"):
                init = rand(rng, (G,) + shape, np.float32)
                buf = popxl.remote_buffer(shape, popxl.float32, 2)
                v = popxl.remote_variable(init if G > 1 else init[0], buf, 1,
                                          replica_grouping=rg, retrieval_mode=mode,
                                          name=f"v_{_gname(grouping)}_{mode}")
                with popxl.in_sequence():
                    x = ops.remote_load(buf, 1)
                    ops.remote_store(buf, 1, x + d)
                groups = [group_of(r, stride, size) for r in range(R)]
                built.append((grouping, mode, v, _out(x, f"o{len(built)}"), init[groups],
                              groups))

    def host_view(grouping, mode, dev, groups):
        size = (grouping or (1, R))[1]
        if mode == "all_replicas" and size > 1:
            return dev
        firsts = [groups.index(g) for g in range(max(groups) + 1)]
        return dev[firsts] if len(firsts) > 1 else dev[firsts[0]]

    errors = Errors()
    devs = [b[4].copy() for b in built]
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(2):
            d_v = rand(rng, (R,) + shape, np.float32)
            got = sess.run({ds: d_v})
            for n, (grouping, mode, v, o, _, groups) in enumerate(built):
                case = f"R{R} remote_variable[{_gname(grouping)},{mode}]"
                errors.check(case, f"run {step} device value", got[o], devs[n])
                devs[n] = devs[n] + d_v
                errors.check(case, f"run {step} get_tensor_data", sess.get_tensor_data(v),
                             host_view(grouping, mode, devs[n], groups))
        writable = [n for n, b in enumerate(built)
                    if b[1] == "one_per_group" or (b[0] or (1, R))[1] == 1]
        new = {n: rand(rng, built[n][2].shape_on_host, np.float32) for n in writable}
        sess.write_variables_data({built[n][2]: new[n] for n in writable})
        got = sess.run({ds: np.zeros((R,) + shape, np.float32)})
        for n in writable:
            grouping, mode, v, o, _, groups = built[n]
            case = f"R{R} remote_variable[{_gname(grouping)},{mode}]"
            want = new[n][groups] if new[n].shape != shape else np.stack([new[n]] * R)
            errors.check(case, "after write_variables_data", got[o], want)
    errors.report(results)


def run_rts(R: int, results: Results) -> None:
    """Per case: out the shard and all_gather(shard, (stride, k)); shard += d (d per replica);
    the host reads the variable; then rewrites it and the device sees the new value."""
    rng = np.random.default_rng(20 + R)
    ir = popxl.Ir(replication=R)
    built = []
    with ir.main_graph:
        for n_case, (grouping, k, shape) in enumerate(RTS[R]):
            stride, size = grouping or (1, R)
            G = R // size
            k_eff = k or size
            rg = ir.replica_grouping(*grouping) if grouping else None
            init = rand(rng, (G,) + shape, np.float32)
            v, shard = popxl.replica_sharded_variable(init if G > 1 else init[0],
                                                      name=f"w{n_case}", replica_grouping=rg,
                                                      shard_over=k)
            c = math.ceil(int(np.prod(shape)) / k_eff)
            problems = []
            if shard.shape != (c,) or shard.meta_shape != shape or v.shape != shape:
                problems.append(f"shapes: shard {shard.shape} meta {shard.meta_shape}, "
                                f"variable {v.shape}; expected ({c},), {shape}")
            ds = popxl.h2d_stream((c,), popxl.float32, f"d{n_case}")
            full = C.replicated_all_gather(shard, group=ir.replica_grouping(stride, k_eff))
            o_shard, o_full = _out(ops.identity(shard), f"s{n_case}"), _out(full, f"f{n_case}")
            ops.add_(shard, ops.host_load(ds))
            groups = [group_of(r, stride, size) for r in range(R)]
            index = [members(r, stride, size).index(r) for r in range(R)]
            shards = np.stack([chunk(init[groups[r]], index[r] % k_eff, k_eff)
                               for r in range(R)])
            name = f"R{R} rts[{_gname(grouping)},shard_over={k_eff},shape={shape}]"
            built.append({"name": name, "v": v, "ds": ds, "c": c, "k": k_eff, "shape": shape,
                          "G": G, "stride": stride, "size": size, "groups": groups,
                          "index": index, "shards": shards, "o_shard": o_shard,
                          "o_full": o_full, "problems": problems})

    def gathered(b, r):
        mem = members(r, b["stride"], b["size"])
        blk = b["index"][r] // b["k"]
        flat = np.concatenate([b["shards"][m] for m in mem[blk * b["k"]:(blk + 1) * b["k"]]])
        return flat[:int(np.prod(b["shape"]))].reshape(b["shape"])

    errors = Errors()
    for b in built:
        for p in b["problems"]:
            errors.by_case.setdefault(b["name"], []).append(p)
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(2):
            d_v = {id(b): rand(rng, (R, b["c"]), np.float32) for b in built}
            got = sess.run({b["ds"]: d_v[id(b)] for b in built})
            for b in built:
                errors.check(b["name"], f"run {step} shards", got[b["o_shard"]], b["shards"])
                for r in range(R):
                    errors.check(b["name"], f"run {step} gather on replica {r}",
                                 got[b["o_full"]][r], gathered(b, r))
                b["shards"] = b["shards"] + d_v[id(b)]
            host = sess.get_tensors_data([b["v"] for b in built])
            for b in built:
                firsts = [b["groups"].index(g) for g in range(b["G"])]
                want = np.stack([gathered(b, f) for f in firsts])
                errors.check(b["name"], f"run {step} get_tensor_data", host[b["v"]],
                             want if b["G"] > 1 else want[0])
        new = {id(b): rand(rng, b["v"].shape_on_host, np.float32) for b in built}
        sess.write_variables_data({b["v"]: new[id(b)] for b in built})
        got = sess.run({b["ds"]: np.zeros((R, b["c"]), np.float32) for b in built})
        for b in built:
            per_group = new[id(b)] if b["G"] > 1 else new[id(b)][None]
            for r in range(R):
                errors.check(b["name"], f"after write, gather on replica {r}",
                             got[b["o_full"]][r], per_group[b["groups"][r]])
    for b in built:
        errors.check(b["name"], "after exit", sess.get_tensor_data(b["v"]), new[id(b)])
    errors.report(results)


def run_explicit_rts(R: int, results: Results) -> None:
    """replica_sharded_buffer (2 entries) + remote_replica_sharded_variable in entry 1: the
    program loads the shard, gathers it and stores shard + 1."""
    grouping = (1, max(2, R // 2))
    stride, size = grouping
    shape = (2, 5)
    G = R // size
    init = np.arange(G * 10, dtype=np.float32).reshape((G,) + shape) - 7
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(*grouping)
        host_shape = (G,) + shape if G > 1 else shape
        buf = popxl.replica_sharded_buffer(host_shape, popxl.float32, rg, entries=2)
        v = popxl.remote_replica_sharded_variable(init.reshape(host_shape), buf, 1, name="v",
                                                  replica_grouping=rg)
        with popxl.in_sequence():
            shard = ops.remote_load(buf, 1, "s")
            full = C.replicated_all_gather(shard, group=ir.replica_grouping(stride, size))
            ops.remote_store(buf, 1, shard + 1.0)
        o = _out(full, "full")
    case = f"R{R} remote_replica_sharded_variable[{_gname(grouping)}]"
    errors = Errors()
    if shard.meta_shape != shape or buf.tensor_shape != (math.ceil(10 / size),):
        errors.by_case[case] = [f"shard meta_shape {shard.meta_shape}, buffer shape "
                                + str(buf.tensor_shape)]
    groups = [group_of(r, stride, size) for r in range(R)]
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(2):
            got = sess.run()
            errors.check(case, f"run {step}", got[o], init[groups] + step)
        errors.check(case, "get_tensor_data", sess.get_tensor_data(v),
                     (init + 2).reshape(host_shape))
    errors.report(results)


def run_memory_report(R: int, results: Results) -> None:
    """An RTS variable of n float32 costs ceil(n/k)*4 bytes of shards per replica; the same
    variable unsharded costs n*4 bytes of on-chip variables."""
    n = 10
    for k in (R, 1):
        ir = popxl.Ir(replication=R)
        with ir.main_graph:
            data = np.arange(n, dtype=np.float32)
            if k > 1:
                _, t = popxl.replica_sharded_variable(data, name="w")
            else:
                t = popxl.variable(data, name="w")
            _out(t, "o")
        with popxl.Session(ir, "ipu_hw") as sess:
            report = sess.device_memory_report()
        key, other, want = (("rts_shards", "variables", math.ceil(n / k) * 4) if k > 1
                            else ("variables", "rts_shards", n * 4))
        bad = [e for e in report if e[key] != want or e[other] != 0]
        results.append((f"R{R} device_memory_report[shard_over={k}]",
                        f"expected {key}={want}, {other}=0; got {bad}" if bad else ""))


def run_offset_error(R: int, results: Results) -> None:
    """An out-of-range runtime offset on the last replica raises naming the buffer; a later run
    with valid offsets works."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        i_s = popxl.h2d_stream((), popxl.int32, "i")
        buf = popxl.remote_buffer((2,), popxl.float32, 3)
        o = _out(ops.remote_load(buf, ops.host_load(i_s, "i")), "o")
    case = f"R{R} out-of-range offset"
    bad = np.zeros(R, np.int32)
    bad[-1] = 3
    with popxl.Session(ir, "ipu_hw") as sess:
        try:
            sess.run({i_s: bad})
            err = "no exception"
        except Exception as e:  # noqa: BLE001 - any error type, the message is what matters
            msg = str(e)
            err = "" if ("remote buffer 1" in msg and "entry 3" in msg) else f"message: {msg}"
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run({i_s: np.full(R, 2, np.int32)})[o]
    if not err and not np.array_equal(got, np.zeros((R, 2), np.float32)):
        err = f"fresh session read {got}"
    results.append((case, err))


def run_entries_of_another_shape(R: int, results: Results) -> None:
    """As upstream, a buffer entry holds a variable's elements in the buffer's shape: `(G, 1)`
    int32 remote variables (`(1, 1)` for one group) in `(1,)` buffers, and an RTS variable
    whose shards live in a 2-D buffer; loaded, updated, stored, read and rewritten by the
    host."""
    errs = Errors()
    full = np.arange(4 * R, dtype=np.float32).reshape(4, R)          # R shards of (2, 2)
    ir = popxl.Ir(replication=R)
    made = []
    with ir.main_graph, popxl.in_sequence():
        for grouping in GROUPINGS[R]:
            rg = ir.replica_grouping(*grouping) if grouping else None
            G = rg.num_groups if rg else 1
            buf = popxl.remote_buffer((1,), popxl.int32)
            v = popxl.remote_variable(np.arange(G, dtype=np.int32)[:, None], buf,
                                      replica_grouping=rg, name=f"v_{_gname(grouping)}")
            t = ops.remote_load(buf, 0)
            made.append((grouping, v, _out(t, f"o_{_gname(grouping)}")))
            ops.remote_store(buf, 0, t + 10)
        rts_buf = popxl.remote_buffer((2, 2), popxl.float32)
        rts = popxl.remote_replica_sharded_variable(full, rts_buf, name="rts")
        shard = ops.remote_load(rts_buf, 0)
        o_rts = _out(shard, "o_rts")
        ops.remote_store(rts_buf, 0, shard * 2)
    case = f"R{R} remote entries of another shape"
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()
        for grouping, v, o in made:
            s, k = grouping or (1, R)
            want = np.array([group_of(r, s, k) for r in range(R)], np.int32)
            errs.check(case, f"{_gname(grouping)} load", got[o].reshape(R), want)
        errs.check(case, "rts shards", got[o_rts].reshape(R, 4),
                   np.stack([chunk(full, r, R) for r in range(R)]))
        for grouping, v, o in made:
            s, k = grouping or (1, R)
            G = R // k
            errs.check(case, f"{_gname(grouping)} host",
                       sess.get_tensor_data(v), (np.arange(G, dtype=np.int32)[:, None] + 10))
        errs.check(case, "rts host", sess.get_tensor_data(rts), full * 2)
        sess.write_variable_data(rts, -full)
        got = sess.run()
        errs.check(case, "rts after write", got[o_rts].reshape(R, 4),
                   np.stack([chunk(-full, r, R) for r in range(R)]))
    errs.report(results)


RUNNERS: list[Callable[[int, Results], None]] = [
    run_round_trip, run_remote_variables, run_rts, run_explicit_rts, run_memory_report,
    run_entries_of_another_shape, run_offset_error]


def main() -> int:
    """Run every case; print `ok <case>` / `FAIL <case>: <details>`; return the failure count."""
    failed = 0
    for R in (2, 4, 8):
        for runner in RUNNERS:
            results: Results = []
            try:
                runner(R, results)
            except Exception:  # noqa: BLE001 - reported as a failed case, the rest still run
                results.append((f"R{R} {runner.__name__}", traceback.format_exc()))
            for name, err in results:
                if err:
                    failed += 1
                    print(f"FAIL {name}: {err}", flush=True)
                else:
                    print(f"ok {name}", flush=True)
    print(f"{'FAILED' if failed else 'passed'}: {failed} failing case(s)", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
