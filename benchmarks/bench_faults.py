"""Time to error or exit of every fault of issue 15 (MPI and Session cases), with real `mpiexec`
ranks, beside a same-run reference (the time of a bare `mpiexec -n 2 python -c pass`).

    python benchmarks/bench_faults.py [--repeats 3] [--timeout 3]

Process cases run `popxl-run --backend mpi --workers 2 tests/popxl_dist/runtime/failure_cases.py`
scenarios; each job is found by an environment marker its processes inherit (other jobs may run
on the machine). Session cases run in this process (local backend) and print which exception
each raises and whether anything ran first. Prints figures (medians), never asserts.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILURES = os.path.join(ROOT, "tests", "popxl_dist", "runtime", "failure_cases.py")
import popart, popdist, popxl  # noqa: E402,F401  (first: the folders tests/popart and
# tests/popdist would be found as namespace packages once tests/ is on sys.path)
sys.path.append(os.path.join(ROOT, "tests"))
from procs import marked_processes  # noqa: E402  (the tests' job finder)

MARKER = "POPXL_BENCH_JOB"


def _env(tag: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    env.update(extra, **{MARKER: tag})
    return env


def _gone(tag: str, timeout: float = 30.0) -> float:
    """Seconds until no process of job `tag` is left (inf if some survive `timeout`; they are
    then killed)."""
    t0 = time.monotonic()
    while marked_processes(MARKER, tag):
        if time.monotonic() - t0 > timeout:
            for pid in marked_processes(MARKER, tag):
                os.kill(pid, signal.SIGKILL)
            return float("inf")
        time.sleep(0.02)
    return time.monotonic() - t0


def mpiexec_reference() -> float:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    t0 = time.monotonic()
    subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - t0


def signal_case(target: str, sig: signal.Signals) -> tuple:
    """Start the `long` scenario, send `sig` to the host rank or to popxl-run; returns
    (seconds until popxl-run exited, seconds until every process of the job was gone)."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "popxl_launch", "--backend", "mpi",
                             "--workers", "2", FAILURES, "long"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(tag), cwd=ROOT,
                            start_new_session=True)
    info = {}
    for line in proc.stdout:
        if line.startswith("running"):
            info = dict(kv.split("=", 1) for kv in line.split()[1:])
            break
    time.sleep(0.5)     # well inside the loop
    os.kill(int(info["host"]) if target == "host" else proc.pid, sig)
    t0 = time.monotonic()
    proc.wait(timeout=60)
    exited = time.monotonic() - t0
    gone = exited + _gone(tag)
    proc.stdout.close()
    return exited, gone


def scenario_time(scenario: str, pattern: str, **extra: str) -> float:
    """Run one failure scenario under popxl-run (mpi, 2 workers); the seconds it reports."""
    tag = uuid.uuid4().hex
    res = subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers",
                          "2", FAILURES, scenario], capture_output=True, text=True, timeout=180,
                         env=_env(tag, **extra), cwd=ROOT)
    left = _gone(tag)
    m = re.search(pattern, res.stdout)
    if m is None or f"ok {scenario}" not in res.stdout or left == float("inf"):
        print(f"  {scenario} FAILED:\n{(res.stdout + res.stderr)[-1500:]}", flush=True)
        return float("nan")
    return float(m.group(1))


def _median(xs) -> str:
    return f"{statistics.median(xs):.2f} s (runs: {', '.join(f'{x:.2f}' for x in xs)})"


def process_cases(repeats: int, timeout: float) -> None:
    ref = [mpiexec_reference() for _ in range(repeats)]
    print(f"reference: bare `mpiexec -n 2 python -c pass`: {_median(ref)}", flush=True)
    for target, sig in (("host", signal.SIGKILL), ("popxl-run", signal.SIGTERM),
                        ("popxl-run", signal.SIGKILL)):
        runs = [signal_case(target, sig) for _ in range(repeats)]
        print(f"{sig.name} to {target}: popxl-run exited after {_median([r[0] for r in runs])}; "
              f"every process of the job gone after {_median([r[1] for r in runs])}", flush=True)
    crash = [scenario_time("crash", r"crash reported after ([\d.]+) s") for _ in range(repeats)]
    print(f"worker killed between runs: WorkerDied after {_median(crash)}", flush=True)
    long = [scenario_time("crash_long", r"reported ([\d.]+) s after the kill")
            for _ in range(repeats)]
    print(f"worker killed in a long repeat (no collective): WorkerDied {_median(long)} after "
          f"the kill", flush=True)
    stall = [scenario_time("stall", r"CollectiveTimeout after ([\d.]+) s",
                           POPXL_COLLECTIVE_TIMEOUT=f"{timeout:g}") for _ in range(repeats)]
    print(f"worker stopped (SIGSTOP) before a collective, POPXL_COLLECTIVE_TIMEOUT={timeout:g}: "
          f"CollectiveTimeout after {_median(stall)} (= timeout + "
          f"{statistics.median(stall) - timeout:.2f} s)", flush=True)


# --- Session cases (in process, local backend) ---------------------------------------------
def session_cases() -> None:
    import popxl
    import popxl.ops as ops

    def counter(n: int = 1, stores: int = 1):
        ir = popxl.Ir(replication=2)
        ir.num_host_transfers = n
        with ir.main_graph:
            xs = popxl.h2d_stream((3,), popxl.float32, "x")
            ys = popxl.d2h_stream((3,), popxl.float32, "y")
            v = popxl.variable(np.zeros(3, np.float32), name="v")
            x = ops.host_load(xs, "x")
            ops.add_(v, x)
            for _ in range(stores):
                ops.host_store(ys, v + 0.0)
        return ir, xs, ys, v

    def report(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported
            took = (time.perf_counter() - t0) * 1e3
            text = str(e).splitlines()[0]
            print(f"  {name}: {type(e).__name__} after {took:.1f} ms: {text[:150]}", flush=True)
        else:
            print(f"  {name}: no exception", flush=True)

    print("Session cases (local backend, in process):", flush=True)
    ir, xs, ys, v = counter()
    ones = np.ones((2, 3), np.float32)
    with popxl.Session(ir, "ipu_hw") as sess:
        report("run([...])", lambda: sess.run([ones]))
        report("run(array)", lambda: sess.run(ones))
        outs = sess.create_host_outputs()
        outs[ys].flags.writeable = False
        report("run_with_outputs into a read-only array", lambda: sess.run_with_outputs(
            {xs: ones}, outs))
        report("float64 1e39 into a float32 stream", lambda: sess.run({xs: np.full((2, 3), 1e39)}))
        print(f"    -> v after the refused calls: {sess.get_tensor_data(v).tolist()} "
              f"(nothing ran)", flush=True)
        snap = sess.get_tensor_data(v)
        report("writing into get_tensor_data's result", lambda: snap.__setitem__(0, 5.0))
        with ir.main_graph:
            report("an op added after the Session", lambda: v + v)
    ir = popxl.Ir()
    with ir.main_graph:
        ints = popxl.h2d_stream((2,), popxl.int32, "i")
        ops.host_store(popxl.d2h_stream((2,), popxl.int32, "o"), ops.host_load(ints, "i") + 1)
    with popxl.Session(ir, "ipu_hw") as sess:
        report("int64 2**40+5 into an int32 stream",
               lambda: sess.run({ints: np.array([1, 2 ** 40 + 5])}))
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        ix = popxl.h2d_stream((1,), popxl.int32, "ix")
        w = popxl.variable(np.zeros(3, np.float32), name="w")
        buf = popxl.remote_buffer((3,), popxl.float32, 4)
        offset = ops.host_load(ix, "ix")
        with popxl.in_sequence():
            ops.remote_store(buf, offset, w)
            g = ops.remote_load(buf, offset)
            ops.add_(w, popxl.constant(np.ones(3, np.float32)))
        ops.host_store(popxl.d2h_stream((3,), popxl.float32, "g"), g)
    with popxl.Session(ir, "ipu_hw") as sess:
        report("replica 1 fails in a run (remote-buffer entry 7 of 4)",
               lambda: sess.run({ix: np.array([[0], [7]], np.int32)}))
        report("  the next run", lambda: sess.run({ix: np.zeros((2, 1), np.int32)}))
        sess.reset()
        sess.run({ix: np.zeros((2, 1), np.int32)})
        print(f"    -> after session.reset() and one run: w = {sess.get_tensor_data(w).tolist()}",
              flush=True)
    ir, xs, ys, v = counter(n=2)
    report("num_host_transfers=2, one store per run", lambda: popxl.Session(ir, "ipu_hw"))
    ir, xs, ys, v = counter()
    sess = popxl.Session(ir, "ipu_hw")
    try:
        with sess:
            sess.run({xs: ones})
            raise KeyError("user code")
    except KeyError:
        pass
    print(f"  exception inside `with session:` after one run: get_tensor_data -> "
          f"{sess.get_tensor_data(v).tolist()} (training kept)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=3.0, help="POPXL_COLLECTIVE_TIMEOUT")
    p.add_argument("--no-processes", action="store_true")
    args = p.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    if not args.no_processes:
        process_cases(args.repeats, args.timeout)
    session_cases()


if __name__ == "__main__":
    main()
