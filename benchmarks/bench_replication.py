"""Replication speed, measured in one run against same-run references:

1. data-parallel scaling of the bench_mlp MLP (784-512-512-512-10, batch 128 per replica, SGD,
   `replicated_all_reduce_(g, op="mean")` on every gradient): R=2 on 2 MPI workers against R=1 on
   the local backend, plus R=2 on the local backend with 1 worker and with 2 worker threads, and
   both programs without the all-reduce op (to separate its cost);
2. all-reduce bandwidth: `replicated_all_reduce_` of a 4M float32 variable (R=2, 2 MPI workers)
   per `session.run`, against a bare mpi4py `Allreduce` between the same 2 ranks;
3. per-`session.run` overhead of each backend for a tiny program (host_load, add, host_store);
4. Ray against MPI in the same run: run overhead, all-reduce bandwidth and data-parallel MLP
   samples/s with 2 workers each, the sub-runs alternating (`--ray` runs only this part);
5. across hosts (`--hosts`, root only: simulated hosts, tests/hosts/simhosts.py): all-reduce of
   4 KiB to 64 MiB over 2 and 3 hosts, Ray links against MPI (hydra over TCP), with and without
   20 ms of added delay; an alpha-beta cost model fitted to it and its projection for 16 and 64
   hosts (`benchmarks/replication_hosts.py`; `--markdown` prints the tables as Markdown).

    python benchmarks/bench_replication.py [--quick] [--ray] [--hosts [--markdown]]

The orchestrator launches sub-runs of this script in worker mode (`--part dp|allreduce|overhead`
under `python -m popxl_launch`, `--part bare_allreduce` under `mpiexec -n 2`) and reads the JSON
line each prints. Figures are medians over rounds; nothing here asserts on time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

SCRIPT = os.path.abspath(__file__)
TAG = "BENCH_JSON "
BATCH = 128
AR_ELEMENTS = 1 << 22                      # 4M float32 = 16.8 MB
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def emit(record: dict[str, Any]) -> None:
    print(TAG + json.dumps(record), flush=True)


def blas_threads() -> str:
    return os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or \
        "default"


def where() -> dict[str, Any]:
    return {"backend": os.environ.get("POPXL_BACKEND", "local"),
            "workers": int(os.environ.get("POPXL_WORKERS", "1") or 1),
            "blas_threads": blas_threads()}


# --- worker mode: data-parallel MLP ---------------------------------------------------------
def build_dp(replicas: int, batch: int, weights, all_reduce: bool):
    """bench_mlp's training step with `replicas` replicas, each gradient averaged over the
    replicas before the SGD update when `all_reduce`."""
    from bench_mlp import build_popxl

    return build_popxl(batch, weights, replicas, all_reduce)


def dp_data(replicas: int, n: int = 8):
    """`n` runs of host data; replica r of run i is seeded (i, r), so replica 0 sees the same
    images whatever R is."""
    runs = []
    for i in range(n):
        xs, ys = [], []
        for r in range(replicas):
            rng = np.random.default_rng([i, r])
            xs.append(rng.normal(size=(BATCH, 28, 28)).astype(np.float32))
            ys.append(rng.integers(0, 10, BATCH).astype(np.int32))
        x, y = np.stack(xs), np.stack(ys)
        runs.append((x[0], y[0]) if replicas == 1 else (x, y))
    return runs


def part_dp(args) -> None:
    """samples/s of each `--variants` program ('ar': all-reduce, 'noar': none), rounds
    alternating. The orchestrator passes one variant per process: a second live Session in the
    same process measurably shifts the other's timings."""
    import popxl
    from bench_mlp import init_weights

    R = args.replicas
    data = dp_data(R)
    variants = args.variants.split(",")
    steppers, first, compile_ms = {}, {}, {}
    for v in variants:
        ir, x_s, l_s, loss_s = build_dp(R, BATCH, init_weights(), all_reduce=(v == "ar"))
        t0 = time.perf_counter()
        sess = popxl.Session(ir, "ipu_hw")
        compile_ms[v] = (time.perf_counter() - t0) * 1e3
        sess.__enter__()

        def step(x, y, sess=sess, x_s=x_s, l_s=l_s, loss_s=loss_s):
            return sess.run({x_s: x, l_s: y})[loss_s]

        first[v] = [float(a) for a in np.atleast_1d(step(*data[0]))]
        for i in range(args.warmup):
            step(*data[(i + 1) % len(data)])
        steppers[v] = step
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v, step in steppers.items():      # variants alternate within each round
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(*data[i % len(data)])
            rates[v].append(R * BATCH * args.steps / (time.perf_counter() - t0))
    emit({"part": "dp", "replicas": R, **where(), "rates": rates, "first_losses": first,
          "compile_ms": compile_ms})


# --- worker mode: all-reduce of 4M float32 ---------------------------------------------------
def part_allreduce(args) -> None:
    import popxl
    from popxl import ops

    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        w = popxl.variable(np.ones(args.elements, np.float32), name="w")
        ops.collectives.replicated_all_reduce_(w, op="add")
    ir_empty = popxl.Ir(replication=2)
    with ir_empty.main_graph:
        popxl.variable(np.zeros(4, np.float32), name="unused")
    sess, empty = popxl.Session(ir, "ipu_hw"), popxl.Session(ir_empty, "ipu_hw")
    with sess, empty:
        sess.run()
        got = sess.get_tensor_data(w)
        ok = bool(np.all(got == 2.0))
        sess.write_variables_data({w: np.zeros(args.elements, np.float32)})  # stays 0 from now
        for _ in range(args.warmup):
            sess.run()
            empty.run()
        ar_ms, empty_us = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                sess.run()
            ar_ms.append((time.perf_counter() - t0) / args.iters * 1e3)
            t0 = time.perf_counter()
            for _ in range(args.empty_iters):
                empty.run()
            empty_us.append((time.perf_counter() - t0) / args.empty_iters * 1e6)
    emit({"part": "allreduce", **where(), "elements": args.elements, "correct": ok,
          "run_ms": ar_ms, "empty_us": empty_us})


def part_allreduce_sizes(args) -> None:
    """Milliseconds per all-reduce (mean) of each of `--sizes` bytes of float32 over all the
    workers' replicas (one per worker): `--chain` all-reduces in a row per `session.run`, each
    reading the previous one's result (so none overlaps another), against an empty program
    (the run's own round trip, subtracted by the orchestrator). Run with
    POPXL_BATCH_COLLECTIVES=0."""
    import popxl
    from popxl import ops

    R = int(os.environ.get("POPXL_WORKERS", "1") or 1)
    ir_empty = popxl.Ir(replication=R)
    with ir_empty.main_graph:
        popxl.variable(np.zeros(4, np.float32), name="unused")
    runs, ok = {}, True
    with popxl.Session(ir_empty, "ipu_hw") as empty:
        for _ in range(args.warmup):
            empty.run()
        t0 = time.perf_counter()
        for _ in range(args.empty_iters):
            empty.run()
        empty_ms = (time.perf_counter() - t0) / args.empty_iters * 1e3
    for nbytes in (int(x) for x in args.sizes.split(",")):
        ir = popxl.Ir(replication=R)
        with ir.main_graph:
            w = popxl.variable(np.ones(nbytes // 4, np.float32), name="w")
            for _ in range(args.chain):
                ops.collectives.replicated_all_reduce_(w, op="mean")
        with popxl.Session(ir, "ipu_hw") as sess:
            sess.run()
            ok = ok and bool(np.all(sess.get_tensor_data(w) == 1.0))
            iters = max(2, min(args.iters, int(args.budget_mb * 1e6 / nbytes / args.chain)))
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                for _ in range(iters):
                    sess.run()
                times.append(((time.perf_counter() - t0) / iters * 1e3 - empty_ms) / args.chain)
        runs[nbytes] = times
    emit({"part": "allreduce_sizes", **where(), "correct": ok, "empty_ms": empty_ms,
          "chain": args.chain, "allreduce_ms": {str(k): v for k, v in runs.items()}})


def part_bare_allreduce(args) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    send = np.full(args.elements, comm.Get_rank() + 1, np.float32)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)
    ok = bool(np.all(recv == comm.Get_size() * (comm.Get_size() + 1) / 2))
    for _ in range(args.warmup):
        comm.Allreduce(send, recv, op=MPI.SUM)
    times = []
    for _ in range(args.rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            comm.Allreduce(send, recv, op=MPI.SUM)
        times.append((time.perf_counter() - t0) / args.iters * 1e3)
    if comm.Get_rank() == 0:
        emit({"part": "bare_allreduce", "ranks": comm.Get_size(), "elements": args.elements,
              "correct": ok, "run_ms": times, "mpi": MPI.Get_library_version().splitlines()[0]})


# --- worker mode: per-run overhead -----------------------------------------------------------
def part_overhead(args) -> None:
    import popxl
    from popxl import ops

    R = args.replicas
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        x_s = popxl.h2d_stream((4,), popxl.float32, "x")
        x = ops.host_load(x_s, "x")
        y_s = popxl.d2h_stream((4,), popxl.float32, "y")
        ops.host_store(y_s, x + 1.0)
    data = np.arange(4 * R, dtype=np.float32).reshape((R, 4) if R > 1 else (4,))
    feed = {x_s: data}
    with popxl.Session(ir, "ipu_hw") as sess:
        ok = bool(np.array_equal(sess.run(feed)[y_s], data + 1))
        run = sess.run
        for _ in range(args.warmup):
            run(feed)
        us = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                run(feed)
            us.append((time.perf_counter() - t0) / args.iters * 1e6)
    emit({"part": "overhead", "replicas": R, **where(), "correct": ok, "run_us": us})


# --- orchestrator ---------------------------------------------------------------------------
def launch(argv: Sequence[str], extra_env: dict[str, str], label: str,
           timeout: float = 180) -> dict[str, Any] | None:
    """Run one sub-run; its JSON record, or None (after printing why) if it failed."""
    env = {k: v for k, v in os.environ.items() if k not in ("POPXL_BACKEND", "POPXL_WORKERS")}
    env.update(extra_env)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"  !! {label}: no result within {timeout:g} s")
        return None
    records = [json.loads(line[len(TAG):]) for line in proc.stdout.splitlines()
               if line.startswith(TAG)]
    if proc.returncode != 0 or not records:
        print(f"  !! {label}: exit code {proc.returncode}, no result; command: {' '.join(argv)}")
        for line in (proc.stdout + proc.stderr).strip().splitlines()[-15:]:
            print(f"     | {line}")
        return None
    records[0]["wall_s"] = time.perf_counter() - t0
    return records[0]


def popxl_run(backend: str, workers: int, part_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "popxl_launch", "--backend", backend, "--workers",
            str(workers), SCRIPT, *part_args]


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float], fmt: str) -> str:
    return f"median of {len(xs)}, range [{format(min(xs), fmt)}-{format(max(xs), fmt)}]"


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


QUICK = {"steps": 15, "rounds": 3, "warmup": 3, "repeats": 1, "ar_iters": 10, "ar_rounds": 3,
         "oh_iters": 200, "oh_rounds": 3}
FULL = {"steps": 30, "rounds": 5, "warmup": 5, "repeats": 2, "ar_iters": 20, "ar_rounds": 5,
        "oh_iters": 500, "oh_rounds": 5}
Row = tuple[str, str, str, str, str, str]


def bench_dp(cfg: dict[str, int]) -> list[Row]:
    """Part 1: samples/s of the data-parallel MLP; the R=1 / R=2-mpi pair is launched
    alternately `repeats` times and their rounds pooled."""
    print(f"\n[1] Data-parallel MLP 784-512-512-512-10, batch {BATCH} per replica, SGD, "
          f"all-reduce(mean) of every gradient; per sub-run {cfg['steps']} steps x "
          f"{cfg['rounds']} rounds after {cfg['warmup']} warm-up steps")
    args = ["--part", "dp", "--steps", str(cfg["steps"]), "--rounds", str(cfg["rounds"]),
            "--warmup", str(cfg["warmup"])]
    # One Session per sub-run: a second live Session in the process shifts the timings (the
    # allocator's state), so every variant gets its own process.
    r1, r2 = [*args, "--replicas", "1"], [*args, "--replicas", "2"]
    noar = ["--variants", "noar"]
    # (key, label, command, env, variant, launched alternately `repeats` times)
    runs = [("r1", "R=1 local (same program; all-reduce over a group of 1)",
             popxl_run("local", 1, r1), ONE_THREAD, "ar", True),
            ("r2_mpi", "R=2 mpi, 2 workers (2 processes)", popxl_run("mpi", 2, r2), ONE_THREAD,
             "ar", True),
            ("r1_noar", "R=1 local, no all-reduce op", popxl_run("local", 1, [*r1, *noar]),
             ONE_THREAD, "noar", True),
            ("r2_mpi_noar", "R=2 mpi, no all-reduce op (replicas diverge; timing only)",
             popxl_run("mpi", 2, [*r2, *noar]), ONE_THREAD, "noar", True),
            ("r2_local1", "R=2 local, 1 worker (both replicas in one thread)",
             popxl_run("local", 1, r2), ONE_THREAD, "ar", False),
            ("r2_local2", "R=2 local, POPXL_WORKERS=2 (2 worker threads)",
             popxl_run("local", 2, r2), ONE_THREAD, "ar", False),
            ("r1_default", "R=1 local, default threads", popxl_run("local", 1, r1), {}, "ar",
             False)]
    rates: dict[str, list[float]] = {k: [] for k, *_ in runs}
    first: dict[str, list[float]] = {}

    def collect(selected: list[tuple]) -> None:
        for key, label, cmd, env, variant, _ in selected:
            rec = launch(cmd, env, label)
            if rec is not None:
                rates[key] += rec["rates"][variant]
                first[key] = rec["first_losses"][variant]

    for _ in range(cfg["repeats"]):         # R=1, R=2 mpi, R=1, R=2 mpi, ...
        collect([r for r in runs if r[5]])
    collect([r for r in runs if not r[5]])
    for key, label, *_ in runs:
        if rates[key]:
            print(f"  {label:58s} {med(rates[key]):8.0f} samples/s  "
                  f"({spread(rates[key], '.0f')})")
    if not rates["r1"] or not rates["r2_mpi"]:
        return [("DP MLP R=2 mpi(2) vs R=1 local", "failed", "", "", ">= 1.6x", "")]
    base, r2mpi = med(rates["r1"]), med(rates["r2_mpi"])
    scale = r2mpi / base
    print(f"  R=2 mpi / R=1 (1 BLAS thread each)        = {scale:.2f}x  (target >= 1.6x, "
          f"2 cores)")
    if rates["r2_mpi_noar"]:
        print(f"  same, both without the all-reduce op      = "
              f"{med(rates['r2_mpi_noar']) / med(rates['r1_noar']):.2f}x")
    if rates["r1_default"]:
        print(f"  R=2 mpi / R=1 with default BLAS threads   = "
              f"{r2mpi / med(rates['r1_default']):.2f}x")
    ref = first["r1"][0]
    r2_first = {k: v for k, v in first.items() if k.startswith("r2")}
    same0 = all(v[0] == ref for v in r2_first.values())
    same = len({tuple(v) for v in r2_first.values()}) == 1
    print(f"  first-step loss: R=1 {ref:.6f}; R=2 {first['r2_mpi']} (replica 0 = R=1's: "
          f"{'yes' if same0 else 'NO'}; identical on {len(r2_first)} R=2 backends: "
          f"{'yes' if same else 'NO'})")
    rows: list[Row] = [("DP MLP R=2 mpi(2) vs R=1 local, 1 thread", f"{r2mpi:.0f} samples/s",
                        f"{base:.0f} samples/s", fmt_ratio(scale), ">= 1.6x",
                        "yes" if scale >= 1.6 else "no")]
    extra = (("R=2 mpi(2) vs R=1, both no all-reduce op", "r2_mpi_noar", "r1_noar"),
             ("R=2 mpi(2) vs R=1 default threads", "r2_mpi", "r1_default"),
             ("R=2 local 1 worker vs R=1", "r2_local1", "r1"),
             ("R=2 local 2 threads vs R=1", "r2_local2", "r1"))
    for label, got, ref_key in extra:
        if rates[got] and rates[ref_key]:
            v, ref_v = med(rates[got]), med(rates[ref_key])
            rows.append((f"  {label}", f"{v:.0f} samples/s", f"{ref_v:.0f} samples/s",
                         fmt_ratio(v / ref_v), "", ""))
    return rows


def bench_allreduce(cfg: dict[str, int]) -> list[Row]:
    """Part 2: popxl all-reduce of 4M float32 per session.run against bare mpi4py."""
    mb = AR_ELEMENTS * 4 / 1e6
    print(f"\n[2] All-reduce of {AR_ELEMENTS} float32 ({mb:.1f} MB), 2 replicas on 2 workers; "
          f"{cfg['ar_iters']} runs x {cfg['ar_rounds']} rounds; GB/s = buffer bytes / time")
    iters = ["--iters", str(cfg["ar_iters"]), "--rounds", str(cfg["ar_rounds"])]
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    bare = launch([mpiexec, "-n", "2", sys.executable, SCRIPT, "--part", "bare_allreduce",
                   *iters], ONE_THREAD, "bare mpi4py Allreduce")
    px = launch(popxl_run("mpi", 2, ["--part", "allreduce", *iters]), ONE_THREAD,
                "popxl all-reduce, mpi")
    px_threads = launch(popxl_run("local", 2, ["--part", "allreduce", *iters]), ONE_THREAD,
                        "popxl all-reduce, local 2 threads")
    rows = [("bare mpi4py comm.Allreduce (mpiexec -n 2)", bare),
            ("popxl replicated_all_reduce_ per session.run, mpi(2)", px),
            ("popxl replicated_all_reduce_ per session.run, local 2 threads", px_threads)]
    for label, rec in rows:
        if rec is not None:
            t = med(rec["run_ms"])
            print(f"  {label:62s} {t:6.2f} ms {mb / t:5.2f} GB/s  "
                  f"({spread(rec['run_ms'], '.2f')} ms){'' if rec['correct'] else '  WRONG'}")
    for label, rec in rows[1:]:
        if rec is not None:
            where_ = label.split(", ")[-1]
            print(f"  {'empty program per session.run, ' + where_:62s} "
                  f"{med(rec['empty_us']) / 1e3:6.2f} ms  ({spread(rec['empty_us'], '.0f')} us)")
    if bare is None or px is None:
        return [("all-reduce 4M f32, popxl mpi(2) vs bare", "failed", "", "", ">= 0.8x", "")]
    ratio = med(bare["run_ms"]) / med(px["run_ms"])
    print(f"  popxl mpi / bare mpi4py bandwidth = {ratio:.2f}x  (target >= 0.8x); {bare['mpi']}")
    return [("all-reduce 4M f32, popxl mpi(2) vs bare mpi4py",
             f"{mb / med(px['run_ms']):.2f} GB/s", f"{mb / med(bare['run_ms']):.2f} GB/s",
             fmt_ratio(ratio), ">= 0.8x", "yes" if ratio >= 0.8 else "no"),
            ("  empty program per run, mpi(2)", f"{med(px['empty_us']):.0f} us", "", "", "", "")]


def bench_overhead(cfg: dict[str, int], quick: bool) -> list[Row]:
    """Part 3: median microseconds per session.run of a tiny program on each backend."""
    print(f"\n[3] Per-session.run overhead, tiny program (host_load (4,) f32, add, host_store); "
          f"{cfg['oh_iters']} runs x {cfg['oh_rounds']} rounds")
    args = ["--part", "overhead", "--iters", str(cfg["oh_iters"]), "--rounds",
            str(cfg["oh_rounds"])]
    configs = [("R=1 local (reference)", "local", 1, 1),
               ("R=2 local, 1 worker", "local", 1, 2),
               ("R=2 local, 2 worker threads", "local", 2, 2),
               ("R=2 mpi, 2 workers", "mpi", 2, 2)]
    if quick:
        print("  (--quick: ray skipped)")
    else:
        configs.append(("R=2 ray, 2 workers", "ray", 2, 2))
    us: dict[str, float] = {}
    for label, backend, workers, R in configs:
        rec = launch(popxl_run(backend, workers, [*args, "--replicas", str(R)]), ONE_THREAD,
                     label)
        if rec is not None:
            us[label] = med(rec["run_us"])
            print(f"  {label:30s} {us[label]:9.1f} us/run  ({spread(rec['run_us'], '.1f')})"
                  f"{'' if rec['correct'] else '  WRONG RESULT'}")
    ref = us.get("R=1 local (reference)")
    return [(f"run overhead, {label}", f"{v:.1f} us", "" if ref is None else f"{ref:.1f} us",
             "" if ref is None else fmt_ratio(v / ref), "", "") for label, v in us.items()]


def bench_ray(cfg: dict[str, int]) -> list[Row]:
    """Part 4: Ray against MPI (2 workers each): the three figures of issue 14, each backend's
    sub-runs alternating with the other's `repeats` times and their rounds pooled."""
    print(f"\n[4] Ray against MPI, R=2 on 2 workers (the driver serves worker 0 on both), "
          f"sub-runs alternating {cfg['repeats']} time(s)")
    parts = {
        "overhead": ["--part", "overhead", "--replicas", "2", "--iters", str(cfg["oh_iters"]),
                     "--rounds", str(cfg["oh_rounds"])],
        "allreduce": ["--part", "allreduce", "--iters", str(cfg["ar_iters"]), "--rounds",
                      str(cfg["ar_rounds"])],
        "dp": ["--part", "dp", "--replicas", "2", "--steps", str(cfg["steps"]), "--rounds",
               str(cfg["rounds"]), "--warmup", str(cfg["warmup"])],
    }
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(cfg["repeats"]):
        for part, args in parts.items():
            for backend in ("mpi", "ray"):
                rec = launch(popxl_run(backend, 2, args), ONE_THREAD, f"{part}, {backend}")
                if rec is None:
                    continue
                if not rec.get("correct", True):
                    print(f"  !! {part}, {backend}: WRONG RESULT")
                values = (rec["run_us"] if part == "overhead" else rec["run_ms"]
                          if part == "allreduce" else rec["rates"]["ar"])
                got.setdefault((part, backend), []).extend(values)
    mb = AR_ELEMENTS * 4 / 1e6
    spec = [("overhead", "run overhead, tiny program", "us/run", lambda v: v, "<= 2x", False),
            ("allreduce", f"all-reduce {mb:.1f} MB", "GB/s", lambda v: mb / v, ">= 0.8x", True),
            ("dp", "data-parallel MLP", "samples/s", lambda v: v, ">= 0.8x", True)]
    rows: list[Row] = []
    for part, label, unit, to_unit, target, higher_better in spec:
        mpi, ray = got.get((part, "mpi")), got.get((part, "ray"))
        if not mpi or not ray:
            rows.append((f"Ray vs MPI: {label}", "failed", "", "", target, ""))
            continue
        m, r = to_unit(med(mpi)), to_unit(med(ray))
        ratio = r / m
        met = ratio >= 0.8 if higher_better else ratio <= 2.0
        fmt = ".2f" if unit == "GB/s" else ".0f"
        for name, vals in (("mpi", mpi), ("ray", ray)):
            print(f"  {label + ', ' + name:40s} {format(to_unit(med(vals)), fmt):>9s} {unit}  "
                  f"({spread([to_unit(v) for v in vals], fmt)})")
        print(f"  {'ray / mpi':40s} {ratio:9.2f}x  (target {target})")
        rows.append((f"Ray vs MPI: {label}", f"{format(r, fmt)} {unit}",
                     f"{format(m, fmt)} {unit}", fmt_ratio(ratio), target, "yes" if met else "no"))
    return rows


def orchestrate(quick: bool, ray_only: bool = False) -> int:
    t_start = time.perf_counter()
    cfg = QUICK if quick else FULL
    print(f"bench_replication{' --quick' if quick else ''}: {os.cpu_count()} CPUs, numpy "
          f"{np.__version__}, python {sys.version.split()[0]}. Sub-runs set "
          f"{'/'.join(ONE_THREAD)}=1 (one BLAS thread per process) unless marked "
          f"'default threads'.")
    print(f"Load average before: {load()} (other processes on these cores skew every figure)")
    if ray_only:
        summary = bench_ray(cfg)
    else:
        summary = bench_dp(cfg) + bench_allreduce(cfg) + bench_overhead(cfg, quick)
        if not quick:
            summary += bench_ray(cfg)
    print("\nSummary (medians; ratio = measured / reference; nothing asserted on time)")
    head: Row = ("measurement", "measured", "reference", "ratio", "target", "met")
    widths = [max(len(r[i]) for r in [head, *summary]) for i in range(len(head))]
    for row in [head, *summary]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"\nTotal wall time {time.perf_counter() - t_start:.0f} s; load average after: "
          f"{load()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds, no ray")
    p.add_argument("--ray", action="store_true",
                   help="only part 4, Ray against MPI (with --quick: fewer rounds)")
    p.add_argument("--hosts", action="store_true",
                   help="only part 5: all-reduce across simulated hosts (root)")
    p.add_argument("--markdown", action="store_true", help="--hosts: tables as Markdown")
    p.add_argument("--part", choices=("dp", "allreduce", "bare_allreduce", "overhead",
                                      "allreduce_sizes"),
                   help="worker mode (used by the sub-runs)")
    p.add_argument("--sizes", default="4096", help="allreduce_sizes: bytes, comma-separated")
    p.add_argument("--chain", type=int, default=8,
                   help="allreduce_sizes: all-reduces in a row per run")
    p.add_argument("--budget-mb", type=float, default=256.0,
                   help="allreduce_sizes: bytes reduced per round at most (fewer iterations "
                        "for large sizes)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--variants", default="ar", help="dp: 'ar' (all-reduce) and/or 'noar'")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--empty-iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--elements", type=int, default=AR_ELEMENTS)
    args = p.parse_args(argv)
    parts = {"dp": part_dp, "allreduce": part_allreduce, "bare_allreduce": part_bare_allreduce,
             "overhead": part_overhead, "allreduce_sizes": part_allreduce_sizes}
    if args.hosts and args.part is None:
        from replication_hosts import run_hosts_part

        return run_hosts_part(SCRIPT, quick=args.quick, markdown=args.markdown)
    if args.part is None:
        return orchestrate(args.quick, args.ray)
    parts[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
