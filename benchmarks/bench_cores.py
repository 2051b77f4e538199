"""What this machine's cores give a matrix product together: the ceiling every thread count's
speed-up meets (issue 31's wall-time figures; `docs/threads.md`).

Contenders, each in a fresh process (2 processes at once for `pair`), alternating round by round:

  solo      one process, one BLAS thread, an in-cache SGEMM (240, 256) @ (256, 512) in a loop
  pair      two such processes at once: their GFLOP/s summed
  single    the GPT benchmark's (1024, 768) @ (768, 3072) product, NumPy, one BLAS thread
  split     the same product on 2 threads, split by popxl-dist (same bits as `single`)
  torch1    the same product in PyTorch, 1 thread (when torch is installed)
  torch2    the same product in PyTorch, 2 threads

pair / solo is what two cores give over one for SGEMM on this machine, whoever computes it. On
a VM whose vCPUs share the host's vector units or clock budget with other work, one process
alone runs fast in some rounds and slow in others: the ratio moves with it (1.6-2.4x measured
here). split and torch2 meet the same ceiling.

    python benchmarks/bench_cores.py [--rounds 5] [--markdown]
    python benchmarks/bench_cores.py --run solo       # one contender, one JSON line
"""
from __future__ import annotations

import _report  # noqa: F401  (first: the load average the script started in)

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SMALL = (240, 256, 512)           # fits in L2 with its operands: FMA-bound, not memory-bound
PRODUCT = (1024, 768, 3072)       # GPT size c's MLP (bench_transformer.py)


def _best_rate(fn: Callable[[], None], flops: float, seconds: float = 1.0) -> float:
    """GFLOP/s of the fastest of 5 timed batches of fn() (each batch about seconds / 5)."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    reps = max(1, int(seconds / 5 / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return flops / best / 1e9


def run(kind: str) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    m, k, n = SMALL if kind == "solo" else PRODUCT
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    flops = 2.0 * m * k * n
    if kind.startswith("torch"):
        import torch

        torch.set_num_threads(int(kind[-1]))
        ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(m, n)
        return _best_rate(lambda: torch.matmul(ta, tb, out=tc), flops)
    out = np.empty((m, n), np.float32)
    if kind == "split":
        from popxl.engine.kernels._matmul_blocks import matmul
        from popxl.engine.parallel import threads
        from popxl.runtime.blas import blas_threads

        with blas_threads(), threads(2):
            return _best_rate(lambda: matmul(a, b, out), flops)
    return _best_rate(lambda: np.matmul(a, b, out=out), flops)


def _launch(kind: str, copies: int = 1) -> float:
    env = dict(os.environ, **ONE_THREAD)
    if kind == "torch2":
        env.update(OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    procs = [subprocess.Popen([sys.executable, __file__, "--run", kind], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    total = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            raise SystemExit(f"bench_cores: contender {kind} failed (exit code {p.returncode})")
        total += json.loads(out.strip().splitlines()[-1])["gflops"]
    return total


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--markdown", action="store_true", help="end with a Markdown table")
    p.add_argument("--run", choices=["solo", "single", "split", "torch1", "torch2"])
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps({"gflops": run(args.run)}))
        return
    kinds = ["solo", "pair", "single", "split"]
    if importlib.util.find_spec("torch") is not None:
        kinds += ["torch1", "torch2"]
    rates: Dict[str, List[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k in kinds:
            rates[k].append(_launch("solo", 2) if k == "pair" else _launch(k))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {rates[k][-1]:.0f}"
                                                          for k in kinds), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}

    def ratio(x: str, y: str) -> str:
        same = [a / b for a, b in zip(rates[x], rates[y])]
        return f"{med[x] / med[y]:.2f}x (rounds {min(same):.2f}-{max(same):.2f})"

    rows = [["SGEMM in cache, 1 process", f"{med['solo']:.0f}", "", ""],
            ["SGEMM in cache, 2 processes at once (sum)", f"{med['pair']:.0f}",
             "vs 1 process", ratio("pair", "solo")],
            [f"{PRODUCT} product, NumPy 1 thread", f"{med['single']:.0f}", "", ""],
            [f"{PRODUCT} product, popxl-dist 2 threads (same bits)", f"{med['split']:.0f}",
             "vs 1 thread", ratio("split", "single")]]
    if "torch1" in med:
        rows += [[f"{PRODUCT} product, PyTorch 1 thread", f"{med['torch1']:.0f}", "", ""],
                 [f"{PRODUCT} product, PyTorch 2 threads", f"{med['torch2']:.0f}",
                  "vs 1 thread", ratio("torch2", "torch1")],
                 ["popxl-dist 2 threads vs PyTorch 2 threads", "", "", ratio("split", "torch2")]]
    head = ["figure", "GFLOP/s (median)", "ratio", ""]
    print()
    print(_report.text_table(head, rows))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    if args.markdown:
        print("\nMeasured: " + _report.machine_line() + "\n")
        print(_report.markdown_table(head, rows))


if __name__ == "__main__":
    main()
