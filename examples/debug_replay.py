"""Replay a failing run in one process: with POPXL_RECORD=DIR (or `popxl-run --record DIR`)
every Session keeps what its latest run needs (device memory at its start, its host inputs);
when a run raises, the run's bundle is written to DIR and the error names it. `popxl-replay
BUNDLE [--replica R] [--pdb]` runs it again in one process, on the local backend, with the
same bits: the same error (or, for a bundle written with `popxl.debug.save_replay`, the same
outputs), wherever it was recorded: one process, MPI ranks, Ray actors or popdist instances.

This script trains until a bad batch (a sample with a negative "variance") makes a NaN on
replica 1 at run 4, then replays that run here and, for the last good run, checks that the
replay gives its outputs bitwise.

    popxl-run --backend mpi --workers 2 examples/debug_replay.py
    popxl-replay /tmp/.../session0-run4 --pdb      # then: `p` any variable, `up` to the call
"""
import os
import sys
import tempfile
from typing import List

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import NonFiniteError

R = 2


def main(argv: List[str] = None) -> int:
    root = tempfile.mkdtemp(prefix="popxl-replay-")
    os.environ["POPXL_RECORD"] = root                  # read when the Session is created
    os.environ["POPXL_DEBUG_NANS"] = "1"
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        vs = popxl.h2d_stream((5,), popxl.float32, "variance")
        scale = popxl.variable(np.ones(5, np.float32), name="scale")
        std = ops.sqrt(ops.host_load(vs, "variance"))   # NaN for a negative variance
        mean_std = ops.collectives.replicated_all_reduce(std, op="mean")
        ops.var_updates.accumulate_(scale, mean_std, 0.01)
        out = popxl.d2h_stream(std.shape, std.dtype, "std")
        ops.host_store(out, std)
    rng = np.random.default_rng(0)
    batches = rng.uniform(0.5, 2.0, (6, R, 5)).astype(np.float32)
    batches[3, 1, 2] = -1.0                              # replica 1's bad sample at run 4
    with popxl.Session(ir, "ipu_hw") as session:
        for run, batch in enumerate(batches, 1):
            try:
                session.run({vs: batch})
            except NonFiniteError as e:
                bundle = e.replay_bundle if hasattr(e, "replay_bundle") else \
                    str(e).rsplit("popxl-replay ", 1)[1].split()[0]
                print(f"run {run} failed; its bundle: {bundle}")
                break
            good = popxl.debug.save_replay(session)[0]
    replayed = popxl.debug.replay(bundle)
    print(f"replayed in one process: {type(replayed.error).__name__}: "
          f"{str(replayed.error).splitlines()[0]}")
    assert isinstance(replayed.error, NonFiniteError) and replayed.error.replica == 1
    again = popxl.debug.replay(good)
    print(f"the last good run ({os.path.basename(good)}) replayed: outputs "
          f"{'identical (bitwise)' if again.identical else 'DIFFERENT'}")
    return 0 if again.identical else 1


if __name__ == "__main__":
    sys.exit(main())
