"""Short runs of the execution-scheme programs, for one process start per backend:

    popxl-run --backend B --workers W schemes_suite.py OUTDIR

writes OUTDIR/pipelined.npz and OUTDIR/phased.npz (weights after two optimiser steps of the
examples, on 2 replicas), OUTDIR/seeds.npz (a grouped seed_variable stepped on the device) and
OUTDIR/memmap.npy (a memmap-backed weight trained in place). A test compares them, bit for
bit, with the same suite run in one process. Exit status = number of failed parts.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import popxl  # noqa: E402
import popxl.ops as ops  # noqa: E402
import popxl_addons as addons  # noqa: E402

import mnist_phased  # noqa: E402
import mnist_pipelined  # noqa: E402

SHORT = ["--limit", "2", "--test-batches", "1", "--no-progress"]


def seeds(path: str) -> None:
    """4 replicas, seeds shared by pairs; two runs each step the device seed."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        seed_var, seed = addons.seed_variable(7, ir.replica_grouping(group_size=2))
        out = popxl.d2h_stream((2,), popxl.uint32, "seed")
        noise_out = popxl.d2h_stream((3,), popxl.float32, "noise")
        with popxl.in_sequence(True):
            use, nxt = ops.split_random_seed(seed)
            ops.host_store(noise_out, ops.random_normal(use, (3,)))
            ops.var_updates.copy_var_update_(seed, nxt)
            ops.host_store(out, seed)
    with popxl.Session(ir, "ipu_hw") as s:
        runs = [s.run() for _ in range(2)]
        stored = s.get_tensor_data(seed_var)
    np.savez(path, seeds=np.stack([r[out] for r in runs]),
             noise=np.stack([r[noise_out] for r in runs]), stored=stored)


def memmap(path: str) -> None:
    """A weight over a memmap file, trained on 2 replicas; weights_to_host writes the file."""
    mm = np.lib.format.open_memmap(path, "w+", np.float32, (3,))
    mm[...] = [1.0, 2.0, 3.0]
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        w = popxl.variable(mm, popxl.float32, "w")
        x = ops.host_load(popxl.h2d_stream((3,), popxl.float32, "x"))
        g = ops.collectives.replicated_all_reduce(x * w, op="mean")
        ops.scaled_add_(w, g, b=-0.5)
        stream = [s for s in ir.get_all_h2d_streams()][0]
    with popxl.Session(ir, "ipu_hw") as s:
        s.run({stream: np.array([[1.0, 1.0, 1.0], [3.0, 0.5, -1.0]], np.float32)})
        assert s.get_tensor_data(w) is mm
    del mm


def main(outdir: str) -> int:
    os.makedirs(outdir, exist_ok=True)
    failed = 0
    failed += mnist_pipelined.main(SHORT + ["--replicas", "2", "--accumulation", "6",
                                            "--save-weights",
                                            os.path.join(outdir, "pipelined.npz")]) != 0
    failed += mnist_phased.main(SHORT + ["--save-weights",
                                         os.path.join(outdir, "phased.npz")]) != 0
    for part, fn, name in (("seeds", seeds, "seeds.npz"), ("memmap", memmap, "memmap.npy")):
        try:
            fn(os.path.join(outdir, name))
            print(f"suite part {part}: ok", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, counted, and the suite goes on
            print(f"suite part {part}: FAILED {type(e).__name__}: {e}", flush=True)
            failed += 1
    print(f"schemes suite: {failed} failed part(s)", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
