"""Failure scenarios of a 2-instance launch (`poprun --num-instances 2 python
instance_failures.py SCENARIO`); instance 1 misbehaves, instance 0 reports what it saw:

  raise     instance 1 raises between two runs (covered by instance_suite's fail-last too)
  kill      instance 1 is killed (SIGKILL) between two runs: instance 0 gets WorkerDied naming
            instance 1
  exit      instance 1 calls sys.exit(3) between two runs: instance 0 hears it left
  mismatch  instance 1 builds a bigger program: the Session reports the difference (caught),
            then
  diverge   instance 1 reads the weights where instance 0 runs the program: both see the
            instances diverged (caught), and a new Session refuses to run collectives
  hang      instance 1 sleeps outside popxl: instance 0 times out (POPXL_COLLECTIVE_TIMEOUT)
            naming it, and the launcher stops instance 1
  early     instance 1 raises before any Session: the launcher stops instance 0 (which waits
            for the others to start their Session)
  early-ir  instance 1 raises after creating its popdist Ir, before any Session (and without
            having used MPI): under a plain mpiexec it joins MPI and aborts the job
  sleep     a long run for Ctrl-C tests: prints `running` first

Instance 0 prints `caught <ExceptionType> after <seconds> s: <message>` (seconds since instance
1 announced its failure with `instance 1 fails at <time>`).
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import popdist
import popxl
from popxl import ops
from popxl.runtime.process.mpi_segments import mpich_segments

INDEX = popdist.getInstanceIndex()


def program(extra: bool = False):
    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs), op="add")
        if extra:
            y = ops.collectives.replicated_all_reduce(y, op="add")
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        ops.var_updates.accumulate_(v, y)
        ys = popxl.d2h_stream((3,), popxl.float32, "y")
        ops.host_store(ys, y)
    return ir, xs


def announce() -> None:
    print(f"instance 1 fails at {time.time():.6f}", flush=True)


def mismatch_then_diverge() -> int:
    x = np.ones(3, np.float32)
    ir, xs = program(extra=INDEX == 1)
    try:
        popxl.Session(ir, "ipu_hw")
    except ValueError as e:
        print(f"caught ValueError: {e}", flush=True)
    ir, xs = program()
    try:
        with popxl.Session(ir, "ipu_hw") as sess:
            sess.run({xs: x})
            if INDEX == 1:
                sess.weights_to_host()
            sess.run({xs: x})
    except Exception as e:  # noqa: BLE001 - reported
        print(f"caught {type(e).__name__}: {e}", flush=True)
    try:
        popxl.Session(ir, "ipu_hw")
    except RuntimeError as e:
        print(f"caught RuntimeError: {e}", flush=True)
    return 0


def main(scenario: str) -> int:
    if scenario == "mismatch-diverge":
        return mismatch_then_diverge()
    if scenario == "early" and INDEX == 1:
        announce()
        raise RuntimeError("instance 1 fails before its Session")
    if scenario == "early-ir" and INDEX == 1:
        popxl.Ir(replication="popdist")
        announce()
        raise RuntimeError("instance 1 fails before its Session")
    if scenario == "sleep":
        ir = popxl.Ir(replication="popdist")
        with ir.main_graph:
            w = popxl.variable(np.ones((128, 128), np.float32), name="w")
            g = ir.create_graph(lambda t: ops.matmul(t, t) * 1e-3, w)
            y, = ops.repeat(g, 1000000, w)
            ops.collectives.replicated_all_reduce_(y)
        with popxl.Session(ir, "ipu_hw") as sess:
            print("running", flush=True)
            sess.run()
        return 0
    ir, xs = program()
    x = np.ones(3, np.float32)
    t0 = time.time()
    try:
        with popxl.Session(ir, "ipu_hw") as sess:
            sess.run({xs: x})
            if INDEX == 0 and "mpi4py.MPI" in sys.modules:
                print(f"segments={','.join(mpich_segments())}", flush=True)
            if INDEX == 1:
                announce()
                if scenario == "raise":
                    raise ZeroDivisionError("instance 1 gives up")
                if scenario == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if scenario == "exit":
                    sys.exit(3)
                if scenario == "hang":
                    time.sleep(120)
            t0 = time.time()
            sess.run({xs: x})
    except Exception as e:  # noqa: BLE001 - reported, then re-raised
        print(f"caught {type(e).__name__} after {time.time() - t0:.3f} s: {e}", flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
