"""Multi-instance (popdist) runs against single-controller MPI, measured in one run:

1. time per `session.run` of the same program and replica count, (a) single controller:
   `popxl-run --backend mpi --workers 2` (the script on rank 0 drives both ranks' replicas),
   (b) two popdist instances: `poprun --num-instances 2` (every rank runs the script and feeds
   its own replicas), with (c) all replicas in one process as the reference. Programs: `tiny`
   (host_load (4,) f32, all-reduce, host_store: one collective per step, nothing else) and `mlp`
   (bench_mlp's 784-512-512-512-10 training step, batch 32 per replica, all-reduce(mean) of
   every gradient);
2. the time for an instance failure to surface in the other instance: instance 1 raises (or is
   SIGKILLed) while instance 0 waits in a collective; the delay between instance 1's failure and
   instance 0's exception (same host clock);
3. with `--ray`, the collectives between instances of a Ray launch (`popxl-run --backend ray
   --instances 2`) against the same program under `poprun --num-instances 2` (MPI instances) in
   the same run: `tiny` (one 16-byte all-reduce per step: latency) and `big` (one all-reduce of
   4M float32 = 16.8 MB per step: bandwidth).

    python benchmarks/bench_instances.py [--quick] [--ray] [--only-ray]

Sub-runs of this script in worker mode print one JSON line (instance 0 / rank 0 only). Figures
are medians; nothing here asserts on time. Every sub-run uses one BLAS thread per process.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_replication import ONE_THREAD, TAG, emit, med, spread  # noqa: E402

SCRIPT = os.path.abspath(__file__)
BATCH = 32
BIG = 1 << 22                  # float32 elements of the `big` all-reduce (16.8 MB)


def _replication(replicas: int):
    import popdist

    return "popdist" if popdist.isPopdistEnvSet() else replicas


def _local_rows(ir, arr: np.ndarray) -> np.ndarray:
    """This process's replicas' rows of a `(R, ...)` global array (upstream's host layout)."""
    import popdist

    local = ir.instance_replication_factor
    off = popdist.getReplicaIndexOffset() if ir._data.instance is not None else 0
    part = arr[off:off + local]
    return part if local > 1 else part[0]


def _build(program: str, replicas: int):
    """(ir, feed maker, output stream) of a benchmark program."""
    import popxl
    from popxl import ops

    if program == "big":
        ir = popxl.Ir(replication=_replication(replicas))
        with ir.main_graph:
            v = popxl.variable(np.ones(BIG, np.float32), name="v")
            ops.collectives.replicated_all_reduce_(v, op="add")
            ops.var_updates.copy_var_update_(v, v * 0.5)
            y_s = popxl.d2h_stream((1,), popxl.float32, "y")
            ops.host_store(y_s, v[0:1])
        return ir, lambda i: {}, y_s
    if program == "tiny":
        ir = popxl.Ir(replication=_replication(replicas))
        with ir.main_graph:
            x_s = popxl.h2d_stream((4,), popxl.float32, "x")
            y = ops.collectives.replicated_all_reduce(ops.host_load(x_s, "x"), op="add")
            y_s = popxl.d2h_stream((4,), popxl.float32, "y")
            ops.host_store(y_s, y)
        R = ir.replication_factor
        x = np.arange(4 * R, dtype=np.float32).reshape(R, 4)
        return ir, lambda i: {x_s: _local_rows(ir, x)}, y_s
    from bench_mlp import build_popxl, init_weights

    ir, x_s, l_s, loss_s = build_popxl(BATCH, init_weights(), _replication(replicas), True)
    R = ir.replication_factor
    feeds = []
    for i in range(4):
        rng = np.random.default_rng(i)
        x = rng.normal(size=(R, BATCH, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, (R, BATCH)).astype(np.int32)
        feeds.append({x_s: _local_rows(ir, x), l_s: _local_rows(ir, y)})
    return ir, lambda i: feeds[i % len(feeds)], loss_s


def part_step(args) -> None:
    import popdist
    import popxl

    ir, feed, out_s = _build(args.program, args.replicas)
    with popxl.Session(ir, "ipu_hw") as sess:
        first = sess.run(feed(0))[out_s]
        for i in range(args.warmup):
            sess.run(feed(i))
        ms = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for i in range(args.steps):
                sess.run(feed(i))
            ms.append((time.perf_counter() - t0) / args.steps * 1e3)
    if popdist.getInstanceIndex() == 0:
        emit({"part": "step", "program": args.program, "replicas": ir.replication_factor,
              "run_ms": ms, "first": np.asarray(first).reshape(-1)[:2].tolist()})


def part_failure(args) -> None:
    """Instance 1 fails after the first run; instance 0 waits for it in the second."""
    import popdist
    import popxl
    from popxl.errors import WorkerError

    ir, feed, out_s = _build("tiny", 2)
    stamp = os.path.join(args.dir, "failed_at")
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run(feed(0))
        if popdist.getInstanceIndex() == 1:
            with open(stamp + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.replace(stamp + ".tmp", stamp)
            if args.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("instance 1 fails")
        try:
            sess.run(feed(1))
        except WorkerError as e:
            caught = time.time()
            with open(stamp) as f:
                failed = float(f.read())
            emit({"part": "failure", "mode": args.mode, "surfaced_s": caught - failed,
                  "error": f"{type(e).__name__}: {e}"[:200]})
            sys.exit(0)


# --- orchestrator ---------------------------------------------------------------------------
def _popxl_run_mpi(args) -> list:
    return [sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers", "2", SCRIPT,
            *args]


def _poprun(replicas: int, args) -> list:
    return [sys.executable, "-m", "popxl_launch.poprun", "--num-instances", "2",
            "--num-replicas", str(replicas), sys.executable, SCRIPT, *args]


def bench_steps(cfg: dict) -> None:
    print(f"\n[1] ms per session.run, same program and replicas: single controller "
          f"(popxl-run --backend mpi --workers 2) vs 2 popdist instances (poprun "
          f"--num-instances 2); {cfg['steps']} steps x {cfg['rounds']} rounds per sub-run, "
          f"sub-runs alternated {cfg['repeats']} times")
    for program, R in (("tiny", 2), ("mlp", 2), ("mlp", 4)):
        part = ["--part", "step", "--program", program, "--replicas", str(R),
                "--steps", str(cfg["steps"] if program == "tiny" else cfg["mlp_steps"]),
                "--rounds", str(cfg["rounds"]), "--warmup", str(cfg["warmup"])]
        runs = {"one process (reference)": [sys.executable, SCRIPT, *part],
                "single controller, mpi 2 ranks": _popxl_run_mpi(part),
                "2 instances (poprun)": _poprun(R, part)}
        times: dict = {k: [] for k in runs}
        firsts: dict = {}
        for _ in range(cfg["repeats"]):
            for label, cmd in runs.items():
                rec = run_sub(cmd, f"{program} R={R} {label}")
                if rec is not None:
                    times[label] += rec["run_ms"]
                    firsts[label] = rec["first"]
        print(f"  {program} R={R}:")
        for label, ms in times.items():
            if ms:
                print(f"    {label:34s} {med(ms):8.3f} ms/run  ({spread(ms, '.3f')})")
        sc, inst = times["single controller, mpi 2 ranks"], times["2 instances (poprun)"]
        if sc and inst:
            print(f"    instances / single controller = {med(inst) / med(sc):.2f}x; "
                  f"per-step difference {med(inst) - med(sc):+.3f} ms")
        # (instance 0's output holds its own replicas only: compare replica 0's)
        same = len({v[0] for v in firsts.values()}) == 1
        print(f"    replica 0's first output identical in all three: {'yes' if same else 'NO'} "
              f"({next(iter(firsts.values()), [None])[0]})")


def _ray_instances(replicas: int, args) -> list:
    return [sys.executable, "-m", "popxl_launch", "--backend", "ray", "--instances", "2",
            "--replicas", str(replicas), SCRIPT, *args]


def bench_ray_instances(cfg: dict) -> None:
    print(f"\n[3] ms per session.run between 2 instances: Ray instances (popxl-run --backend ray "
          f"--instances 2) vs MPI instances (poprun --num-instances 2), sub-runs alternated "
          f"{cfg['repeats']} times")
    for program, steps in (("tiny", cfg["steps"]), ("big", cfg["big_steps"])):
        part = ["--part", "step", "--program", program, "--replicas", "2", "--steps",
                str(steps), "--rounds", str(cfg["rounds"]), "--warmup", str(cfg["warmup"])]
        runs = {"MPI instances (poprun)": _poprun(2, part),
                "Ray instances": _ray_instances(2, part)}
        times: dict = {k: [] for k in runs}
        ratios = []
        for _ in range(cfg["repeats"]):
            got = {}
            for label, cmd in runs.items():
                rec = run_sub(cmd, f"{program} {label}")
                if rec is not None:
                    times[label] += rec["run_ms"]
                    got[label] = med(rec["run_ms"])
            if len(got) == 2:
                ratios.append(got["Ray instances"] / got["MPI instances (poprun)"])
        extra = " (16.8 MB all-reduce)" if program == "big" else " (16-byte all-reduce)"
        print(f"  {program}{extra}:")
        for label, ms in times.items():
            if ms:
                rate = f", {BIG * 4 / (med(ms) * 1e-3) / 1e9:.2f} GB/s" if program == "big" \
                    else ""
                print(f"    {label:26s} {med(ms):8.3f} ms/run{rate}  ({spread(ms, '.3f')})")
        if ratios:
            print(f"    Ray / MPI = {med(ratios):.2f}x (median of the same-run ratios "
                  f"{', '.join(f'{r:.2f}' for r in ratios)})")


def run_sub(cmd, label: str, must_succeed: bool = True) -> dict | None:
    """One sub-run; the JSON record it printed (instance 0's, after poprun's line prefix), or
    None after showing why. Failure sub-runs fail by design (`must_succeed=False`)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True,
                          timeout=300, check=False)
    for line in proc.stdout.splitlines():
        _, tag, rest = line.partition(TAG)
        if tag and (proc.returncode == 0 or not must_succeed):
            rec = json.loads(rest)
            rec["wall_s"] = time.perf_counter() - t0
            return rec
    print(f"  !! {label}: exit code {proc.returncode}, no result")
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-10:]:
        print(f"     | {line}")
    return None


def bench_failures(cfg: dict) -> None:
    print(f"\n[2] time for an instance failure to surface in the other instance (poprun 2 "
          f"instances; instance 0 waits in an all-reduce), {cfg['fail_repeats']} launches each")
    for mode in ("raise", "kill"):
        took = []
        for _ in range(cfg["fail_repeats"]):
            with tempfile.TemporaryDirectory() as d:
                rec = run_sub(_poprun(2, ["--part", "failure", "--mode", mode, "--dir", d]),
                              f"failure {mode}", must_succeed=False)
            if rec is not None:
                took.append(rec["surfaced_s"] * 1e3)
                error = rec["error"]
        if took:
            print(f"  instance 1 {'raises' if mode == 'raise' else 'is SIGKILLed':14s} "
                  f"{med(took):8.1f} ms  ({spread(took, '.1f')})  -> {error}")


def orchestrate(quick: bool, ray: bool, only_ray: bool) -> int:
    cfg = ({"steps": 200, "mlp_steps": 10, "big_steps": 10, "rounds": 3, "warmup": 5,
            "repeats": 1, "fail_repeats": 2} if quick else
           {"steps": 500, "mlp_steps": 20, "big_steps": 20, "rounds": 5, "warmup": 10,
            "repeats": 3, "fail_repeats": 3})
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    print(f"bench_instances{' --quick' if quick else ''}: {os.cpu_count()} CPUs, load {load}")
    if not only_ray:
        bench_steps(cfg)
        bench_failures(cfg)
    if ray or only_ray:
        bench_ray_instances(cfg)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ray", action="store_true", help="also compare Ray and MPI instances")
    p.add_argument("--only-ray", action="store_true", help="only compare Ray and MPI instances")
    p.add_argument("--part", choices=("step", "failure"))
    p.add_argument("--program", choices=("tiny", "mlp", "big"), default="tiny")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mode", choices=("raise", "kill"), default="raise")
    p.add_argument("--dir", default="")
    args = p.parse_args(argv)
    if args.part == "step":
        part_step(args)
        return 0
    if args.part == "failure":
        part_failure(args)
        return 0
    return orchestrate(args.quick, args.ray, args.only_ray)


if __name__ == "__main__":
    sys.exit(main())
