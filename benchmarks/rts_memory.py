"""Device memory of replicated tensor sharding: `examples/mnist_rts.py` with and without RTS.

For each replica count, builds both training programs (4-layer MLP, Adam, gradient
accumulation), attaches them and prints the per-replica device bytes that
`session.device_memory_report()` gives (on-chip variables, RTS shards, remote buffers), split
into the tensors RTS shards (weights >= threshold and their Adam moments: "sharded part") and
the rest (biases, their moments, gradient accumulators, step counters), with the ratio no-RTS /
RTS. The sharded part should shrink by the replica count. It then trains both for a few steps,
prints the median step time of each, and whether their weights are bitwise equal.

    python benchmarks/rts_memory.py [--replicas 2 4] [--steps 5]
    popxl-run --backend mpi --workers 2 benchmarks/rts_memory.py --replicas 4

Figures only; nothing here asserts. Under mpi on a machine with few cores, set
OPENBLAS_NUM_THREADS=1: each rank's BLAS threads otherwise compete for the cores and step times
swing between ~0.1 and ~1 s (2 cores, 2 ranks).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import mnist_data_parallel as dp
import mnist_rts


def step_times(program, steps: int) -> list[float]:
    """Seconds per `session.run` (one optimiser step) for `steps` steps after one warm-up."""
    from popxl_launch.data import load_mnist

    images, labels = load_mnist("train")
    batches = dp.train_batches(images, labels, program, epoch=1)
    times = []
    with program.session:
        for i, (x, y) in zip(range(steps + 1), batches):
            t0 = time.perf_counter()
            program.session.run(dict(zip(program.input_streams, [x, y])))
            if i:
                times.append(time.perf_counter() - t0)
    return times


def run(replicas: int, steps: int, threshold: int) -> None:
    programs = {
        "no RTS": mnist_rts.build_train_program(replicas, rts_threshold=threshold, rts=False),
        "RTS": mnist_rts.build_train_program(replicas, rts_threshold=threshold, rts=True),
    }
    rts = programs["RTS"]
    print(f"\n== {replicas} replicas; sharded: {', '.join(rts.rts_keys) or 'nothing'} "
          f"(threshold {threshold} elements) ==")
    for prog in programs.values():
        prog.session.__enter__()
    try:
        print(mnist_rts.memory_table(programs))
    finally:
        for prog in programs.values():
            prog.session.__exit__(None, None, None)
    full = programs["no RTS"].candidate_bytes()
    print(f"expected sharded part: {full:,} bytes whole, {full // replicas:,} bytes sharded "
          f"over {replicas} replicas")
    if steps < 1:
        return
    medians = {}
    for label, prog in programs.items():
        medians[label] = statistics.median(step_times(prog, steps))
    print("median step time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in medians.items())
          + f" (RTS / no RTS = {medians['RTS'] / medians['no RTS']:.2f})")
    weights = {k: dp.trained_weights(p) for k, p in programs.items()}
    same = all(np.array_equal(weights["RTS"][n], weights["no RTS"][n]) for n in weights["RTS"])
    print(f"weights after {steps + 1} steps bitwise equal: {'yes' if same else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 4],
                   help="replica counts to report (default 2 4)")
    p.add_argument("--steps", type=int, default=5,
                   help="timed optimiser steps per program (0: memory only; default 5)")
    p.add_argument("--rts-threshold", type=int, default=1024)
    args = p.parse_args(argv)
    if any(r < 2 for r in args.replicas):
        p.error("--replicas: RTS needs at least 2 replicas")
    for r in args.replicas:
        run(r, args.steps, args.rts_threshold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
