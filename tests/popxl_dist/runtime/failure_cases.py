"""Failure scenarios, run unchanged under every backend: `python failure_cases.py SCENARIO...`
(or under `popxl-run --backend B --workers 2`).

Scenarios (each prints `ok <scenario> <seconds>` or `FAIL <scenario>: <details>`):
  error     replica 1 raises inside a kernel (a remote-buffer offset out of range): the host gets
            an exception naming replica 1 and the RemoteStore op; a later run of a fresh
            session works.
  diverge   a conditional runs an all-reduce on replica 0 only: the host gets an exception saying
            the replicas diverged, instead of a hang.
  crash     the process of worker 1 is killed during a session (mpi / ray only): the host gets
            WorkerDied naming worker 1 within 10 s.
  sleep     a long run (for Ctrl-C tests): prints `running` and runs a long program.
Exit status: number of failed scenarios.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import EngineError, WorkerDied

R = 2


def _offset_program():
    """x is stored to and loaded back from entry `i` (streamed per replica) of a 4-entry remote
    buffer, then all-reduced."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        ix = popxl.h2d_stream((1,), popxl.int32, "i")
        buf = popxl.remote_buffer((3,), popxl.float32, 4)
        offset = ops.host_load(ix, "i")
        with popxl.in_sequence():
            ops.remote_store(buf, offset, ops.host_load(xs, "x"))
            x = ops.remote_load(buf, offset)
        y = ops.collectives.replicated_all_reduce(x, op="add")
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
    return ir, xs, ix, ys


def scenario_error() -> None:
    ir, xs, ix, ys = _offset_program()
    data = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    with popxl.Session(ir, "ipu_hw") as sess:
        try:
            sess.run({xs: data, ix: np.array([[0], [7]], np.int32)})
        except EngineError as e:
            msg = str(e)
            assert "replica 1" in msg and "RemoteStore" in msg and "entry 7" in msg, msg
        else:
            raise AssertionError("no exception for an out-of-range offset on replica 1")
    with popxl.Session(ir, "ipu_hw") as sess:      # the pool still works
        out = sess.run({xs: data, ix: np.array([[1], [2]], np.int32)})[ys]
    np.testing.assert_array_equal(out, np.tile(data.sum(axis=0), (2, 1)))


def scenario_diverge() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        cs = popxl.h2d_stream((), popxl.bool, "c")
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        c, x = ops.host_load(cs, "c"), ops.host_load(xs, "x")
        then_g = ir.create_graph(lambda t: ops.collectives.replicated_all_reduce(t), x)
        else_g = ir.create_graph(lambda t: t + 1.0, x)
        y, = ops.conditional(c, then_g, else_g, then_inputs=[x], else_inputs=[x])
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
    with popxl.Session(ir, "ipu_hw") as sess:
        ok = sess.run({cs: np.array([True, True]), xs: np.ones((2, 2), np.float32)})[ys]
        np.testing.assert_array_equal(ok, np.full((2, 2), 2.0))
        try:
            sess.run({cs: np.array([True, False]), xs: np.ones((2, 2), np.float32)})
        except EngineError as e:
            assert "diverged" in str(e), str(e)
        else:
            raise AssertionError("divergent collectives were not detected")


def _worker_pid(index: int) -> int:
    backend = os.environ.get("POPXL_BACKEND", "local")
    if backend == "mpi":
        from popxl.runtime.mpi import mpi_pool

        return mpi_pool().procs[index][1]
    if backend == "ray":
        from popxl.runtime.ray_backend import ray_pool

        return ray_pool(int(os.environ.get("POPXL_WORKERS", "2"))).pids[index]
    raise RuntimeError("the crash scenario needs worker processes (mpi or ray)")


def scenario_crash() -> None:
    ir, xs, ix, ys = _offset_program()
    data = np.ones((2, 3), np.float32)
    idx = np.zeros((2, 1), np.int32)
    t0 = None
    try:
        with popxl.Session(ir, "ipu_hw") as sess:
            sess.run({xs: data, ix: idx})
            os.kill(_worker_pid(1), signal.SIGKILL)
            t0 = time.monotonic()
            for _ in range(1000):
                sess.run({xs: data, ix: idx})
    except WorkerDied as e:
        took = time.monotonic() - t0
        assert "worker 1" in str(e) or "[1]" in str(e), str(e)
        assert "replica 1" in str(e), str(e)
        assert took < 10, f"the death was reported after {took:.1f} s"
        print(f"crash reported after {took:.2f} s: {e}", flush=True)
    else:
        raise AssertionError("killing worker 1 raised nothing")


def scenario_sleep() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        w = popxl.variable(np.ones((256, 256), np.float32), name="w")

        def body(t):
            return ops.matmul(t, t) * 1e-3

        g = ir.create_graph(body, w)
        y, = ops.repeat(g, 1000000, w)
        ops.collectives.replicated_all_reduce_(y)
    with popxl.Session(ir, "ipu_hw") as sess:
        print("running", flush=True)
        sess.run()


SCENARIOS = {"error": scenario_error, "diverge": scenario_diverge, "crash": scenario_crash,
             "sleep": scenario_sleep}


def main(names) -> int:
    failed = 0
    for name in names:
        t = time.monotonic()
        try:
            SCENARIOS[name]()
            print(f"ok {name} {time.monotonic() - t:.2f}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported per scenario
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
