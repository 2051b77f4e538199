"""Step time of the execution-scheme examples against the same model without the scheme,
measured in the same run (interleaved runs, medians), with the FLOPs of each program
(`popxl_addons.evaluate_ir_FLOPs`) to separate the scheme's extra arithmetic (recomputation)
from the emulator's cost of running it.

    python benchmarks/bench_schemes.py [--runs 9]

Prints figures only (the machine may be shared: compare the ratios, not the absolute times).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import popxl_addons as addons  # noqa: E402

import mnist_phased  # noqa: E402
import mnist_pipelined  # noqa: E402


def _inputs(program, rng):
    lead = program.host_shape(program.micro_batch)
    x = rng.random(lead + (mnist_phased.IMAGE_SIZE,), dtype=np.float32)
    y = rng.integers(0, 10, lead).astype(np.int32)
    return dict(zip(program.input_streams, (x, y)))


def compare(label: str, programs: dict, runs: int) -> None:
    """Interleaved timed runs of `programs` ({name: TrainProgram}, the reference last)."""
    rng = np.random.default_rng(0)
    times = {k: [] for k in programs}
    flops = {k: addons.total_FLOPs(p.session.ir) for k, p in programs.items()}
    inputs = {k: _inputs(p, rng) for k, p in programs.items()}
    for p in programs.values():
        p.session.__enter__()
    try:
        for k, p in programs.items():         # first run outside the timing
            p.session.run(inputs[k])
        for _ in range(runs):
            for k, p in programs.items():
                t = time.perf_counter()
                p.session.run(inputs[k])
                times[k].append(time.perf_counter() - t)
    finally:
        for p in programs.values():
            p.session.__exit__(None, None, None)
    names = list(programs)
    ref = names[-1]
    print(f"\n{label} ({runs} interleaved runs each, median ms per optimiser step)")
    print(f"{'program':<34}{'ms/step':>10}{'GFLOP/step':>12}{'time ratio':>12}"
          f"{'FLOP ratio':>12}")
    for k in names:
        med = 1000 * float(np.median(times[k]))
        ratio = np.median(times[k]) / np.median(times[ref])
        print(f"{k:<34}{med:>10.1f}{flops[k] / 1e9:>12.3f}{ratio:>12.2f}"
              f"{flops[k] / flops[ref]:>12.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args()
    compare("Phased execution, 2 replicas x 4 micro batches x 8 images", {
        "phased (RTS remote, batch serial)": mnist_phased.build_phased_program(),
        "same model without phases": mnist_phased.build_plain_program()}, args.runs)
    compare("Pipelining, 1 replica x 8 micro batches x 16 images", {
        "pipelined (3 stages, 2 IPUs)": mnist_pipelined.build_train_program(),
        "same ops without the pipeline": mnist_pipelined.build_train_program(pipelined=False)},
        args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
