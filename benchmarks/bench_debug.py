"""What the debugging options cost (issue 29), and that they cost nothing when off.

Workload: the GPT training step of `bench_transformer.py` (size a by default) with 2 replicas in
one process (their gradient all-reduce exercises the collectives and the flight recorder). Each
contender runs in a fresh process, the contenders alternate round by round, figures are medians
over rounds: CPU ms per step (every contender on one thread), Session creation (IR build +
Session: the replica-consistency pass runs there) and peak RSS.

Contenders: `off` (no option), each option alone (`POPXL_DEBUG_NANS`, `POPXL_CHECK_REPLICAS`,
`POPXL_RECORD`), all of them, and, with `--reference-python PY`, the same workload under
another install (e.g. a checkout from before the debugging tools: "off" must be no slower).

    python benchmarks/bench_debug.py --rounds 5
    python benchmarks/bench_debug.py --reference-python /path/to/base/.venv/bin/python --markdown

Nothing here asserts on time; figures are only worth quoting on a quiet machine (the load
average is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from _report import machine_line, markdown_table, text_table

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSFORMER = os.path.join(HERE, "bench_transformer.py")
TAG = "BENCH_JSON "
DEBUG_VARS = ("POPXL_DEBUG_NANS", "POPXL_CHECK_REPLICAS", "POPXL_RECORD",
              "POPXL_FLIGHT_RECORDER")
# Every contender computes on one thread: CPU time is then comparable with an install from before
# the intra-op threads (more threads spend more CPU time for less wall time).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "POPXL_THREADS": "1"}


def _run(python: str, env_extra: Dict[str, str], size: str, steps: int,
         script: str) -> Optional[dict]:
    env = {k: v for k, v in os.environ.items() if k not in DEBUG_VARS}
    env.update(ONE_THREAD)
    env.update(env_extra)
    cmd = [python, script, "--run", "popxl", "--size", size, "--replicas", "2"]
    if steps:
        cmd += ["--steps", str(steps)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in res.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    print(f"  (failed: {res.stderr.strip()[-400:]})", file=sys.stderr)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="a", choices=["a", "b", "c"])
    p.add_argument("--steps", type=int, default=0, help="measured steps (0: the benchmark's)")
    p.add_argument("--reference-python", default="",
                   help="a Python of another install: the same workload there, options off")
    p.add_argument("--reference-script", default="",
                   help="that install's bench_transformer.py (default: this one)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    record_dir = tempfile.mkdtemp(prefix="popxl-bench-record-")
    contenders = {"off": (sys.executable, {}, TRANSFORMER)}
    if args.reference_python:
        contenders["reference (off)"] = (args.reference_python, {},
                                         args.reference_script or TRANSFORMER)
    contenders.update({
        "POPXL_DEBUG_NANS=1": (sys.executable, {"POPXL_DEBUG_NANS": "1"}, TRANSFORMER),
        "POPXL_CHECK_REPLICAS=1": (sys.executable, {"POPXL_CHECK_REPLICAS": "1"}, TRANSFORMER),
        "POPXL_RECORD=DIR": (sys.executable, {"POPXL_RECORD": record_dir}, TRANSFORMER),
        "all three": (sys.executable, {"POPXL_DEBUG_NANS": "1", "POPXL_CHECK_REPLICAS": "1",
                                       "POPXL_RECORD": record_dir}, TRANSFORMER),
    })
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start",
          file=sys.stderr)
    got: Dict[str, List[dict]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        for name, (python, env, script) in contenders.items():
            rec = _run(python, env, args.size, args.steps, script)
            if rec is not None:
                got[name].append(rec)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    load = os.getloadavg()
    base = statistics.median(x["cpu_step_ms"] for x in got["off"]) if got["off"] else float("nan")
    rows = []
    for name, recs in got.items():
        if not recs:
            rows.append((name, "failed", "", "", ""))
            continue
        cpu = statistics.median(x["cpu_step_ms"] for x in recs)
        compile_s = statistics.median(x["compile_s"] for x in recs)
        rss = statistics.median(x["peak_rss_mb"] for x in recs)
        rows.append((name, f"{cpu:.2f}", f"{cpu / base:.2f}x", f"{compile_s:.2f}",
                     f"{rss:.0f}"))
    head = ("contender", "CPU ms / step", "vs off", "IR + Session s", "peak RSS MB")
    if args.markdown:
        print(f"Measured: {machine_line()}\n")
        print(markdown_table(head, rows))
        print(f"\nGPT size {args.size}, 2 replicas in one process on one thread, medians of "
              f"{args.rounds} rounds, each contender a fresh process.")
        return 0
    print(text_table(head, rows))
    print(f"GPT size {args.size}, 2 replicas in one process on one thread, medians of "
          f"{args.rounds} rounds; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
