"""Faults of an MPI job that must surface and leave nothing behind, with real `mpiexec` ranks:
the host (rank 0) killed, `popxl-run` sent SIGTERM or SIGKILL, a worker killed during a long
loop with no collective, a worker stopped before a collective. Each job is found by an
environment marker its processes inherit (other jobs run on this machine at the same time),
and its MPICH shared-memory segment must be gone too. Measured times are printed (`-s`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from procs import marked_processes
from test_backends import FAILURES, HAVE_MPI, ROOT, wait_until

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")

MARKER = "POPXL_TEST_JOB"


def job_processes(tag: str) -> list:
    """Pids of the job's processes (popxl-run, mpiexec, hydra's proxy, the rank shells and the
    ranks: they all inherit `MARKER=tag`)."""
    return marked_processes(MARKER, tag)


class Job:
    """`popxl-run --backend mpi --workers 2 failure_cases.py long`, started in its own session
    and marked; `running` tells the pids and MPICH segments."""

    def __init__(self):
        self.tag = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
        env[MARKER] = self.tag
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers", "2",
             FAILURES, "long"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env, cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + 120
        self.info = {}
        for line in self.proc.stdout:
            if line.startswith("running"):
                self.info = dict(kv.split("=", 1) for kv in line.split()[1:])
                break
            assert time.monotonic() < deadline, "the job never started"
        assert self.info, "the job ended before running"
        self.host = int(self.info["host"])
        self.segments = [s for s in self.info["segments"].split(",") if s]
        assert self.segments, "the host maps no MPICH segment"
        assert len(job_processes(self.tag)) >= 4       # popxl-run, mpiexec, proxy, 2 ranks

    def gone(self, timeout: float = 20) -> float:
        """Seconds until no process of the job is left (asserts it happens)."""
        t0 = time.monotonic()
        assert wait_until(lambda: not job_processes(self.tag), timeout), \
            [open(f"/proc/{p}/cmdline").read() for p in job_processes(self.tag)]
        return time.monotonic() - t0

    def output(self) -> str:
        try:
            return self.proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            return "(no output: popxl-run still runs)"

    def cleanup(self) -> None:
        for pid in job_processes(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def job():
    j = Job()
    try:
        yield j
    finally:
        j.cleanup()
        leaked = [s for s in j.segments if os.path.exists(s)]
        for s in leaked:
            os.unlink(s)
    assert not leaked, f"the job's MPICH segment survived: {leaked}"


def test_killed_host_ends_every_rank_and_popxl_run(job):
    os.kill(job.host, signal.SIGKILL)
    t0 = time.monotonic()
    job.proc.wait(timeout=30)
    took = time.monotonic() - t0
    left = job.gone()
    out = job.output()
    print(f"\nhost SIGKILL: popxl-run exited after {took:.2f} s, every process gone "
          f"{left:.2f} s later")
    assert job.proc.returncode != 0
    assert "the host (MPI rank 0" in out and "died" in out, out[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signal_to_popxl_run_ends_the_whole_job(job, sig):
    os.kill(job.proc.pid, sig)
    t0 = time.monotonic()
    job.proc.wait(timeout=30)
    exited = time.monotonic() - t0
    left = exited + job.gone()
    print(f"\n{sig.name} to popxl-run: it exited after {exited:.2f} s, the whole job was gone "
          f"after {left:.2f} s")
    assert job.proc.returncode in (128 + sig, -sig)


def run_marked(scenario: str, **extra_env: str):
    """Run one failure scenario under `popxl-run --backend mpi --workers 2`, marked; returns
    (the completed process, seconds until no process of the job was left), after checking
    that its MPICH segment is gone."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    env.update(extra_env, **{MARKER: tag})
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers",
                          "2", FAILURES, scenario], capture_output=True, text=True, timeout=120,
                         env=env, cwd=ROOT)
    assert wait_until(lambda: not job_processes(tag)), "a process of the job survived"
    took = time.monotonic() - t0
    segments = [s for line in res.stdout.splitlines() if line.startswith("job segments=")
                for s in line.split("=", 1)[1].split(",") if s]
    assert segments, res.stdout[-2000:]
    leaked = [s for s in segments if os.path.exists(s)]
    for s in leaked:
        os.unlink(s)
    assert not leaked, f"the job's MPICH segment survived: {leaked}"
    return res, took


def test_worker_killed_in_a_long_loop_is_reported_within_two_seconds():
    res, _ = run_marked("crash_long")
    out = res.stdout + res.stderr
    assert "ok crash_long" in res.stdout, out[-3000:]
    assert res.returncode == 0, out[-3000:]
    print("\n" + next(line for line in res.stdout.splitlines() if "reported" in line))


def test_worker_killed_mid_all_reduce_is_reported_as_worker_died():
    """Workers 0 and 1 wait for worker 2 in an all-reduce when it is killed, and worker 1
    notices first (the scenario signals it as hydra did): the host still raises WorkerDied
    naming worker 2 at once (worker 1's failed collective used to surface instead, as a
    WorkerError, after a 5 s wait for the dead worker's answer)."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    env[MARKER] = tag
    res = subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", "mpi",
                          "--workers", "3", FAILURES, "crash_mid"], capture_output=True,
                         text=True, timeout=180, env=env, cwd=ROOT)
    out = res.stdout + res.stderr
    assert "ok crash_mid" in res.stdout, out[-3000:]
    assert wait_until(lambda: not job_processes(tag)), "a process of the job survived"
    print("\n" + next(line for line in res.stdout.splitlines() if "WorkerDied" in line))


def test_stopped_worker_raises_collective_timeout_at_the_timeout():
    res, took = run_marked("stall", POPXL_COLLECTIVE_TIMEOUT="3")
    out = res.stdout + res.stderr
    assert "ok stall" in res.stdout, out[-3000:]
    assert res.returncode == 0, out[-3000:]
    print("\n" + next(line for line in res.stdout.splitlines() if "CollectiveTimeout" in line)
          + f"\n(the job with the stopped worker was gone {took:.1f} s after it started)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signal_to_popxl_run_instances_ends_the_whole_job(tmp_path, sig):
    """`popxl-run --instances 2` (poprun's launch path): mpiexec has a parent-death signal."""
    script = tmp_path / "wait.py"
    script.write_text("import time\nprint('running', flush=True)\ntime.sleep(120)\n")
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    env[MARKER] = tag
    proc = subprocess.Popen([sys.executable, "-m", "popxl_launch", "--backend", "mpi",
                             "--instances", "2", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        assert any("running" in line for line in proc.stdout), "the job never started"
        assert len(job_processes(tag)) >= 4      # popxl-run, mpiexec, proxy, 2 ranks
        os.kill(proc.pid, sig)
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert wait_until(lambda: not job_processes(tag)), \
            [open(f"/proc/{p}/cmdline").read() for p in job_processes(tag)]
        print(f"\n{sig.name} to popxl-run --instances 2: the whole job was gone after "
              f"{time.monotonic() - t0:.2f} s")
    finally:
        for pid in job_processes(tag):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        proc.stdout.close()
