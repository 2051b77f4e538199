"""The profiler (POPXL_PROFILE / popxl-run --profile): its trace is a valid Chrome trace (checked
against the format's documented fields), every op of the program appears once per run per
replica (graphs called twice twice, loop bodies once per iteration, batched collectives listed
in their step), one track per worker and replica, collectives split into wait and transfer, one
clock across workers (checked by what must hold physically: no replica leaves a collective
before the last one entered it; the host's request spans its workers' run), on local threads,
MPI ranks and Ray actors; with profiling off the compiled program is exactly the plain one."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.engine.executor import Worker

BIN = os.path.dirname(sys.executable)
RUNS = 2
R = 4
M, K, N = 4, 8, 8

PROGRAM = f'''
import numpy as np
import popxl
import popxl.ops as ops

R, RUNS = {R}, {RUNS}


def build():
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream(({M}, {K}), popxl.float32, "x")
        w = popxl.variable(np.full(({K}, {N}), 0.1, np.float32), name="w")
        x = ops.host_load(xs, "x")

        def layer(t, w):
            return ops.gelu(t @ w)

        g = ir.create_graph(layer, x, w)
        y1, = ops.call(g, x, w)
        y2, = ops.call(g, y1, w)
        a = ops.collectives.replicated_all_reduce(y1)
        b = ops.collectives.replicated_all_reduce(y2)

        def body(t):
            return t + 1.0

        lg = ir.create_graph(body, a)
        c, = ops.repeat(lg, 3, a)
        s = ops.sum(b + c)
        ys = popxl.d2h_stream(s.shape, s.dtype, "s")
        ops.host_store(ys, s)
    return ir, xs, ys


def main():
    ir, xs, ys = build()
    data = np.arange(R * {M} * {K}, dtype=np.float32).reshape(R, {M}, {K}) / 100
    with popxl.Session(ir, "ipu_hw") as sess:
        for _ in range(RUNS):
            out = sess.run({{xs: data}})
    return ir, out[ys]


if __name__ == "__main__":
    main()
'''


def _program(tmp_path: Path):
    path = tmp_path / "profiled.py"
    path.write_text(PROGRAM)
    spec = importlib.util.spec_from_file_location("profiled", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


# --- an independent check of the Chrome trace event format (the JSON object form) -------
_METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
             "thread_sort_index": "sort_index"}


def check_chrome_trace(doc) -> None:
    """The fields the Trace Event Format document requires of complete ("X") and metadata
    ("M") events, with their types."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("X", "M"), ev
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        assert isinstance(ev.get("args", {}), dict), ev
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
            assert ev["dur"] >= 0 and isinstance(ev["cat"], str), ev
        else:
            assert ev["name"] in _METADATA and _METADATA[ev["name"]] in ev["args"], ev


def _op_id(label: str) -> int:
    return int(label.split(" ")[0].split(".")[1])


def expected_counts(ir) -> Counter:
    """How often each op of the main program runs per run: called graphs once per call site,
    loop bodies once per iteration."""
    data = ir._data
    counts: Counter = Counter()

    def walk(gid: str, times: int, main: bool) -> None:
        for op in data.graphs[gid].ops:
            if main and op.exec_ctx != "Normal":
                continue
            counts[op.id] += times
            if op.type == "Call":
                walk(op.called[0], times, False)
            elif op.type == "Loop":
                walk(op.called[0], times * int(op.attrs["trip_count"]), False)

    walk("", 1, True)
    return counts


def check_profile(doc, ir, workers: int) -> None:
    """Every structural promise of the trace for `RUNS` runs of the test program."""
    check_chrome_trace(doc)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    # tracks: the host, one process per worker, one thread per replica
    assert sorted(procs) == list(range(workers + 1)) and procs[0].startswith("host")
    blocks = [list(range(w * R // workers, (w + 1) * R // workers)) for w in range(workers)]
    for w, reps in enumerate(blocks):
        assert procs[w + 1].startswith(f"worker {w} ")
        for r in reps:
            assert names[(w + 1, r + 1)] == f"replica {r}"
    runs = {(e["pid"], e["args"]["run"]): e for e in events
            if e["cat"] == "run" and e["name"].startswith("run ")}
    assert sorted(runs) == sorted((w + 1, k + 1) for w in range(workers) for k in range(RUNS))
    host_runs = sorted((e for e in events if e["pid"] == 0 and e["name"] == "Session.run"),
                       key=lambda e: e["ts"])
    assert len(host_runs) == RUNS
    eps = 1.0      # us: rounding of ts and dur
    for (pid, k), run in runs.items():     # one clock: the host's request spans its workers'
        host = host_runs[k - 1]
        assert host["ts"] - eps <= run["ts"] and \
            run["ts"] + run["dur"] <= host["ts"] + host["dur"] + eps
    want = expected_counts(ir)
    collectives = defaultdict(list)       # (run, seq) -> slices of every replica
    for (pid, k), run in runs.items():
        lo, hi = run["ts"] - eps, run["ts"] + run["dur"] + eps
        for r in blocks[pid - 1]:
            mine = sorted((e for e in events if e["pid"] == pid and e["tid"] == r + 1
                           and lo <= e["ts"] <= hi), key=lambda e: (e["ts"], -e["dur"]))
            seen: Counter = Counter()
            seq = 0
            for i, e in enumerate(mine):
                if e["cat"] in ("collective.wait", "collective.transfer"):
                    continue
                seen[_op_id(e["args"]["op"])] += 1
                for label in e["args"].get("batched", [])[1:]:
                    seen[_op_id(label)] += 1
                if e["cat"] == "collective":
                    wait, transfer = mine[i + 1], mine[i + 2]
                    assert (wait["name"], transfer["name"]) == ("wait for peers", "transfer")
                    assert abs(wait["ts"] - e["ts"]) <= eps
                    assert abs(wait["ts"] + wait["dur"] - transfer["ts"]) <= eps
                    assert abs(transfer["ts"] + transfer["dur"] - e["ts"] - e["dur"]) <= eps
                    assert abs(e["args"]["wait_us"] - wait["dur"]) <= eps
                    collectives[(k, seq)].append(e)
                    seq += 1
            assert seen == want, (pid, r, k)
    for (k, seq), slices in collectives.items():
        assert len(slices) == R
        # one clock: nobody leaves a collective before the last replica entered it
        assert max(e["ts"] for e in slices) <= min(e["ts"] + e["dur"] for e in slices) + eps


def _op_args(doc, type_: str) -> dict:
    return next(e["args"] for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == type_)


def test_local_threads_trace_table_and_same_bits(tmp_path, monkeypatch, capsys):
    path, mod = _program(tmp_path)
    monkeypatch.setenv("POPXL_WORKERS", "2")
    monkeypatch.delenv("POPXL_PROFILE", raising=False)
    _, plain = mod.main()
    monkeypatch.setenv("POPXL_PROFILE", str(tmp_path / "prof"))
    ir, profiled = mod.main()
    np.testing.assert_array_equal(plain, profiled)          # the same bits
    trace = popxl.debug.write_profile(print_table=True)
    assert trace is not None and Path(trace).parent == tmp_path / "prof"
    doc = json.loads(Path(trace).read_text())
    check_profile(doc, ir, workers=2)
    mm = _op_args(doc, "MatMul")
    assert mm["flops"] == 2 * M * N * K and mm["bytes"] == 4 * (M * K + K * N + M * N)
    assert mm["source"].endswith("profiled.py:17") and mm["inputs"][0].endswith("(4, 8) float32")
    assert "batched" in _op_args(doc, "ReplicatedAllReduce x2 (batched)")
    table = capsys.readouterr().err
    assert table == Path(trace.replace("popxl-trace-", "popxl-profile-")[:-5] + ".txt").read_text()
    assert "session" in table and "GFLOP/s" in table
    # the table sums the runs after the first: MatMul ran twice per run on every replica
    matmul = next(line.split() for line in table.splitlines() if " MatMul." in line)
    assert int(matmul[2]) == (RUNS - 1) * R * 2 and float(matmul[5]) > 0     # calls, GFLOP/s
    rows = [line.split() for line in table.splitlines()
            if line.strip() and line.split()[0].isdigit() and len(line.split()) == 7]
    assert sorted(int(r[0]) for r in rows) == list(range(R))    # collectives per replica
    assert popxl.debug.write_profile() is None            # written once


def test_profiling_off_compiles_the_plain_program(tmp_path, monkeypatch):
    """Off, no clock read is compiled; on, the program is the plain one plus the clock lines
    (same kernels, memory plan and batched collectives)."""
    _, mod = _program(tmp_path)
    monkeypatch.delenv("POPXL_PROFILE", raising=False)
    ir, *_ = mod.build()
    data = ir._data
    plain = Worker(data)
    assert plain.program.instrument is None and plain.profiler is None
    data.debug = data.debug.with_(profile_dir=str(tmp_path))
    timed = Worker(data)
    assert timed.profiler is not None
    graphs = ["main", "weights_from_host", "weights_to_host"]
    pairs = [(getattr(plain.program, g), getattr(timed.program, g)) for g in graphs]
    pairs += [(plain.program.graph(gid), timed.program.graph(gid)) for gid in data.graphs
              if gid]
    for a, b in pairs:
        assert "_clk" not in a.source
        kept = [line for line in b.source.splitlines()
                if "ctx.prof.append(" not in line and line.strip() != "_t = _clk()"]
        assert kept == a.source.splitlines()
        assert b.memory_plan.buffer_bytes == a.memory_plan.buffer_bytes
    assert "ctx.prof.append(" in timed.program.main.source


@pytest.mark.parametrize("backend", [
    pytest.param("mpi", marks=pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                                 reason="needs the mpi extra")),
    pytest.param("ray", marks=pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                                 reason="needs the ray extra")),
])
def test_popxl_run_profile_on_processes(backend, tmp_path):
    path, mod = _program(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    out = subprocess.run([os.path.join(BIN, "popxl-run"), "--backend", backend, "--workers", "2",
                          "--profile", str(tmp_path / "prof"), str(path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    traces = list((tmp_path / "prof").glob("popxl-trace-*.json"))
    assert len(traces) == 1, out.stderr[-3000:]
    doc = json.loads(traces[0].read_text())
    ir, _ = mod.build()[0], None
    check_profile(doc, ir, workers=2)
    pids = {e["args"]["name"].split("pid ")[1].split(" ")[0] for e in doc["traceEvents"]
            if e["name"] == "process_name" and e["pid"] > 0}
    assert len(pids) == 2                      # two processes
    assert "collectives per replica" in out.stderr


def test_flops_of_a_convolution_and_its_gradients():
    """Conv, ConvDataGrad and ConvWeightsGrad each do the forward's multiply-adds:
    2 * N * M * Ho * Wo * (C / groups) * kh * kw."""
    from popxl.debug.op_info import describe_ops

    n, c, h, w, m, k, groups = 2, 4, 9, 8, 6, 3, 2
    ir = popxl.Ir()
    with ir.main_graph:
        def f(x, wt):
            return ops.conv(x, wt, groups=groups)

        x = popxl.variable(np.ones((n, c, h, w), np.float32))
        wt = popxl.variable(np.ones((m, c // groups, k, k), np.float32))
        g = ir.create_graph(f, x, wt)
        ops.call(g, x, wt)
        dg = popxl.transforms.autodiff(g)
    want = 2 * n * m * (h - k + 1) * (w - k + 1) * (c // groups) * k * k
    infos = describe_ops(ir._data).values()
    got = {i.type: i.flops for i in infos if i.type.startswith("Conv")}
    assert got == {"Conv": want, "ConvDataGrad": want, "ConvWeightsGrad": want}, (got, dg)
