"""What the profiler costs (issue 30), and that it costs nothing when off.

Workloads, each contender in a fresh process, contenders alternating round by round, medians
over rounds:

* the main job (`popxl-run configs/mnist.yaml`, `--epochs` epochs): its own median training
  step (ms);
* the GPT training step of `bench_transformer.py` (2 replicas in one process, size `--size`):
  CPU ms per step.

The main job runs at its default settings (its step is wall time: both installs run its two
replicas side by side); the GPT step on one thread (`bench_debug.ONE_THREAD`: CPU time then
compares like with like against an install from before the intra-op threads).

Contenders: `off`; `POPXL_PROFILE=DIR` (the trace written at exit is part of the cost: a job's
wall time is printed too); with `--reference-python PY`, the same workloads under another install
(e.g. a checkout from before the profiler: "off" must be no slower).

    python benchmarks/bench_profile.py --rounds 5
    python benchmarks/bench_profile.py --reference-python /path/to/base/.venv/bin/python --markdown

Nothing here asserts on time; figures are only worth quoting on a quiet machine (the load
average is printed at the start and the end).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _report import machine_line, markdown_table, text_table  # noqa: E402
from bench_debug import TRANSFORMER, _run as run_gpt  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "mnist.yaml")
_STEP = re.compile(r"one training step: median ([\d.]+) ms")


def run_job(python: str, env_extra: Dict[str, str], epochs: int) -> Optional[dict]:
    """The main job in a fresh process: its median step (ms) and wall seconds."""
    bindir = os.path.dirname(python)
    run_dir = tempfile.mkdtemp(prefix="popxl-bench-job-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    env.update(env_extra)
    t0 = time.perf_counter()
    res = subprocess.run([os.path.join(bindir, "popxl-run"), CONFIG, "--set",
                          f"train.epochs={epochs}", "--run-dir", os.path.join(run_dir, "r")],
                         env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(run_dir, ignore_errors=True)
    m = _STEP.search(res.stdout)
    if res.returncode != 0 or m is None:
        print(f"  (job failed: {res.stderr.strip()[-400:]})", file=sys.stderr)
        return None
    return {"step_ms": float(m.group(1)), "wall_s": wall}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="epochs of the main job per run")
    p.add_argument("--size", default="a", choices=["a", "b", "c"])
    p.add_argument("--steps", type=int, default=0, help="GPT steps (0: the benchmark's)")
    p.add_argument("--reference-python", default="")
    p.add_argument("--reference-script", default="",
                   help="that install's bench_transformer.py (default: this one)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    trace_dir = tempfile.mkdtemp(prefix="popxl-bench-profile-")
    contenders = {"off": (sys.executable, {}, TRANSFORMER)}
    if args.reference_python:
        contenders["reference (off)"] = (args.reference_python, {},
                                         args.reference_script or TRANSFORMER)
    contenders["POPXL_PROFILE=DIR"] = (sys.executable, {"POPXL_PROFILE": trace_dir},
                                       TRANSFORMER)
    print("load average at the start: %.2f %.2f %.2f" % os.getloadavg(), file=sys.stderr)
    job: Dict[str, List[dict]] = {n: [] for n in contenders}
    gpt: Dict[str, List[dict]] = {n: [] for n in contenders}
    for r in range(args.rounds):
        for name, (python, env, script) in contenders.items():
            got = run_job(python, env, args.epochs)
            if got:
                job[name].append(got)
            got = run_gpt(python, env, args.size, args.steps, script)
            if got:
                gpt[name].append(got)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg(), file=sys.stderr)

    def med(rows: List[dict], key: str) -> float:
        return statistics.median(x[key] for x in rows) if rows else float("nan")

    base_job, base_gpt = med(job["off"], "step_ms"), med(gpt["off"], "cpu_step_ms")
    head = ("contender", "main job: step ms", "vs off", "main job: wall s",
            f"GPT {args.size}: CPU ms / step", "vs off")
    rows = []
    for name in contenders:
        js, gs = med(job[name], "step_ms"), med(gpt[name], "cpu_step_ms")
        rows.append((name, f"{js:.2f}", f"{js / base_job:.2f}x", f"{med(job[name], 'wall_s'):.1f}",
                     f"{gs:.2f}", f"{gs / base_gpt:.2f}x"))
    if args.markdown:
        print(f"Measured: {machine_line()}\n")
        print(markdown_table(head, rows))
        print(f"\nThe main job ({args.epochs} epochs, default settings) and GPT size {args.size} "
              f"with 2 replicas in one process on one thread; medians of {args.rounds} rounds, "
              f"each contender a fresh process.")
    else:
        print(text_table(head, rows))
    shutil.rmtree(trace_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
