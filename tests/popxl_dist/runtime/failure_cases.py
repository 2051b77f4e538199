"""Failure scenarios, run unchanged under every backend: `python failure_cases.py SCENARIO...`
(or under `popxl-run --backend B --workers 2`).

Scenarios (each prints `ok <scenario> <seconds>` or `FAIL <scenario>: <details>`):
  error     replica 1 raises inside a kernel (a remote-buffer offset out of range): the host gets
            an exception naming replica 1 and the RemoteStore op; a later run of a fresh
            session works.
  diverge   a conditional runs an all-reduce on replica 0 only: the host gets an exception saying
            the replicas diverged, instead of a hang.
  crash     the process of worker 1 is killed during a session (mpi / ray only): the host gets
            WorkerDied naming worker 1 within 10 s; the Session then refuses runs
            (SessionFailed) and cannot be reset (WorkerDied).
  sleep     a long run (for Ctrl-C tests): prints `running` and runs a long program.
  long      like sleep, with no collective for the whole loop; prints
            `running host=PID workers=PID,... segments=PATH,...` (the MPI job's shared memory).
  crash_long  worker 1 is killed (mpi / ray) while every replica computes a long loop with no
            collective: WorkerDied naming worker 1 within 2 s of the kill.
  stall     worker 1 is stopped (SIGSTOP, mpi / ray) before a collective: CollectiveTimeout
            naming the op, the replicas and worker 1 at POPXL_COLLECTIVE_TIMEOUT (run with a
            few seconds), not later.
  crash_mid worker 2 of 3 is killed while every other worker waits for it in an all-reduce
            (mpi / ray, 3 workers): the host gets WorkerDied naming worker 2, at once, never a
            failed collective of a worker that saw it die.
  (crash_long and stall also print `job segments=PATH,...`.)
Exit status: number of failed scenarios.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import CollectiveTimeout, EngineError, SessionFailed, WorkerDied

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
        from popxl.runtime.backends.mpi import mpi_pool

        return mpi_pool().procs[index][1]
    if backend == "ray":
        from popxl.runtime.backends.ray import ray_pool

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
    with sess:          # failed: runs raise naming the death; a reset cannot reach worker 1
        for call, err in ((lambda: sess.run({xs: data, ix: idx}), SessionFailed),
                          (sess.reset, WorkerDied)):
            try:
                call()
            except err as e:
                assert "worker" in str(e) and "died" in str(e), str(e)
            else:
                raise AssertionError(f"no {err.__name__} after the crash")


def scenario_sleep() -> None:
    ir = _long_loop_program(1000000)
    with popxl.Session(ir, "ipu_hw") as sess:
        print("running", flush=True)
        sess.run()


def _long_loop_program(iterations: int):
    """A repeat of small matmuls with no collective, then one all-reduce (all ones: a fixed
    point of the loop)."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        w = popxl.variable(np.ones((128, 128), np.float32), name="w")
        g = ir.create_graph(lambda t: ops.matmul(t, t) * (1 / 128), w)
        y, = ops.repeat(g, iterations, w)
        ops.collectives.replicated_all_reduce_(y)
    return ir


def _job_segments() -> str:
    if os.environ.get("POPXL_BACKEND") != "mpi":
        return ""
    from popxl.runtime.process.mpi_segments import mpich_segments

    return ",".join(mpich_segments())


def scenario_long() -> None:
    ir = _long_loop_program(300_000)
    with popxl.Session(ir, "ipu_hw") as sess:
        workers = ",".join(str(_worker_pid(i)) for i in range(1, R)) \
            if os.environ.get("POPXL_BACKEND") in ("mpi", "ray") else ""
        print(f"running host={os.getpid()} workers={workers} segments={_job_segments()}",
              flush=True)
        sess.run()


def scenario_crash_long() -> None:
    ir = _long_loop_program(300_000)
    killed = []

    def kill() -> None:
        killed.append(time.monotonic())
        os.kill(_worker_pid(1), signal.SIGKILL)

    with popxl.Session(ir, "ipu_hw") as sess:
        print(f"job segments={_job_segments()}", flush=True)
        timer = threading.Timer(1.0, kill)
        timer.start()
        try:
            sess.run()
        except WorkerDied as e:
            took = time.monotonic() - killed[0]
            assert "worker 1" in str(e) or "[1]" in str(e), str(e)
            assert took < 2, f"the death was reported {took:.2f} s after the kill"
            print(f"crash_long reported {took:.2f} s after the kill: {e}", flush=True)
        else:
            raise AssertionError("killing worker 1 raised nothing")
        finally:
            timer.cancel()


def scenario_stall() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((4,), popxl.float32, "x")
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs, "x"))
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
    from popxl.runtime.env import collective_timeout

    timeout = collective_timeout()
    data = np.ones((R, 4), np.float32)
    with popxl.Session(ir, "ipu_hw") as sess:
        print(f"job segments={_job_segments()}", flush=True)
        sess.run({xs: data})
        os.kill(_worker_pid(1), signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            sess.run({xs: data})
        except CollectiveTimeout as e:
            took = time.monotonic() - t0
            msg = str(e)
            assert "ReplicatedAllReduce" in msg and "worker 1" in msg and "replica 1" in msg \
                and "replica 0" in msg, msg
            assert e.workers == (1,), e.workers
            assert took < timeout + 1.5, f"CollectiveTimeout after {took:.2f} s ({timeout} s)"
            print(f"stall: CollectiveTimeout after {took:.2f} s (timeout {timeout:g} s): {msg}",
                  flush=True)
        else:
            raise AssertionError("a stopped worker raised nothing")


def scenario_crash_mid() -> None:
    replicas = int(os.environ.get("POPXL_WORKERS", "3"))
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        xs = popxl.h2d_stream((1 << 16,), popxl.float32, "x")
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs, "x"))
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
    data = np.ones((replicas, 1 << 16), np.float32)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({xs: data})
        victim = _worker_pid(2)
        os.kill(victim, signal.SIGSTOP)         # the others reach the all-reduce and wait
        killed = []

        def kill() -> None:
            killed.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)
            if os.environ.get("POPXL_BACKEND") == "mpi":
                # What hydra did on a rank's death: SIGUSR1 to the others. Worker 1 then sees
                # the death first, before the host's own check.
                os.kill(_worker_pid(1), signal.SIGUSR1)

        timer = threading.Timer(1.5, kill)
        timer.start()
        try:
            sess.run({xs: data})
        except WorkerDied as e:
            took = time.monotonic() - killed[0]
            assert "worker(s) [2]" in str(e) or "worker 2" in str(e), str(e)
            assert took < 4.0, f"the death was reported {took:.1f} s after the kill"
            print(f"crash_mid: WorkerDied {took:.2f} s after the kill: {e}", flush=True)
        except EngineError as e:
            raise AssertionError(f"killing worker 2 mid all-reduce raised {type(e).__name__}, "
                                 f"not WorkerDied: {e}") from None
        else:
            raise AssertionError("killing worker 2 raised nothing")
        finally:
            timer.cancel()


SCENARIOS = {"error": scenario_error, "diverge": scenario_diverge, "crash": scenario_crash,
             "sleep": scenario_sleep, "long": scenario_long, "crash_long": scenario_crash_long,
             "stall": scenario_stall, "crash_mid": scenario_crash_mid}


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
