"""Multi-instance runs with real launches: poprun and plain mpiexec over MPI ranks, popxl-run
--instances over Ray actors.

* The Graphcore-style data-parallel example gives bitwise the same losses and weights in one
  process (4 replicas), under `poprun --num-instances 2 --num-replicas 4`, under
  `mpiexec -n 4 python script.py` and under `popxl-run --backend ray --instances 2 --replicas 4`.
* The user guide's RTS programs (2 x 2 replicas in the suite launch; 8 instances x 16 replicas
  with groupings) and the addons hierarchical all-reduce (2 x 4) give the documented values.
* The backend suite's collective / remote-buffer cases, split over instances, pass; the script's
  own mpi4py traffic is untouched; instance-0-only writes work.
* An instance that raises, exits, dies, hangs or diverges makes the others fail naming it within
  seconds; the exit code is the originating instance's; Ctrl-C leaves nothing behind.

Launches are few: one suite launch per launcher runs most scenarios.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from procs import mapped_files, run_in_session, tree_pids, wait_until
from procs import session_processes as job_processes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SUITE = os.path.join(HERE, "instance_suite.py")
FAILURES = os.path.join(HERE, "instance_failures.py")
DEBUG = os.path.join(HERE, "instance_debug.py")
DP = os.path.join(ROOT, "examples", "mnist_popdist.py")
RTS = os.path.join(ROOT, "examples", "rts_popdist.py")
DP_ARGS = ["--limit", "3", "--test-batches", "2"]

BIN = os.path.dirname(sys.executable)
HAVE_MPI = (importlib.util.find_spec("mpi4py") is not None
            and os.path.exists(os.path.join(BIN, "mpiexec")))
HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray not installed")

_LAUNCH_VARS = ("POPXL_", "POPDIST_", "PMI_", "OMPI_", "MPI_LOCAL")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def launch(cmd, timeout: float = 300, **env):
    """Run `cmd` in a new session; the result has `.sid` for `job_processes`."""
    res = run_in_session(cmd, clean_env(**env), ROOT, timeout)
    res.text = res.stdout + res.stderr
    return res


def poprun(*args, **kw):
    return launch([sys.executable, "-m", "popxl_launch.poprun", *args], **kw)


def popxl_run(*args, **kw):
    return launch([sys.executable, "-m", "popxl_launch", *args], **kw)


def lines_of(text: str, prefix: str) -> list:
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


# --- the data-parallel reference ------------------------------------------------------------
@pytest.fixture(scope="module")
def dp_reference(tmp_path_factory):
    """Losses (steps x accumulation x 4 replicas) and weights of the example in one process."""
    for var in [v for v in os.environ if v.startswith(("POPDIST_", "PMI_", "OMPI_"))]:
        os.environ.pop(var)
    sys.path.insert(0, os.path.dirname(DP))
    import mnist_popdist

    out = tmp_path_factory.mktemp("dp_one_process")
    assert mnist_popdist.main([*DP_ARGS, "--replicas", "4", "--save-losses", str(out),
                               "--save-weights", str(out / "weights.npz")]) == 0
    return load_dp(out)


@pytest.fixture(scope="module")
def tp2d_reference():
    """The 2-D tensor-parallel cases' digest in one process (8 replicas)."""
    for var in [v for v in os.environ if v.startswith(("POPDIST_", "PMI_", "OMPI_"))]:
        os.environ.pop(var)
    import tp2d_cases

    results, digest = tp2d_cases.run()
    assert not [r for r in results if r[1]], results
    return digest


def load_dp(directory) -> tuple:
    """(losses over all replicas, weights) from the files the example's instances saved."""
    files = sorted(os.listdir(directory))
    parts = []
    for name in files:
        m = re.fullmatch(r"losses_(\d+)-(\d+)\.npy", name)
        if m:
            parts.append((int(m.group(1)), np.load(os.path.join(directory, name))))
    losses = np.concatenate([a for _, a in sorted(parts)], axis=2)
    with np.load(os.path.join(directory, "weights.npz")) as f:
        weights = {k: f[k] for k in f.files}
    return losses, weights


def assert_dp_bitwise(directory, reference) -> None:
    losses, weights = load_dp(directory)
    ref_losses, ref_weights = reference
    assert losses.shape == ref_losses.shape == (3, 4, 4)
    assert losses.tobytes() == ref_losses.tobytes(), (losses, ref_losses)
    assert weights.keys() == ref_weights.keys()
    for k in weights:
        assert weights[k].tobytes() == ref_weights[k].tobytes(), f"weight {k} differs"


def assert_suite(res, prefix: str, instances: int, parts: list) -> None:
    """Every part ok on every instance; instance 0 caught instance 1's failure at the end."""
    text = res.text
    assert "FAIL" not in res.stdout, text[-6000:]
    for i in range(instances):
        got = lines_of(res.stdout, prefix.format(i=i, stream="stdout"))
        for part in parts:
            assert f"part {part}: ok" in got, (i, part, text[-6000:])
    zero = lines_of(res.stdout, prefix.format(i=0, stream="stdout"))
    assert "ok fail-last" in zero and "suite: 0 failed part(s)" in zero, text[-6000:]
    assert res.returncode == 1, text[-3000:]     # instance 1's uncaught exception
    one = lines_of(res.stdout, prefix.format(i=1, stream="stdout"))
    failed_at = float(next(x for x in one if x.startswith("instance 1 fails at")).split()[-1])
    caught = next(x for x in zero if x.startswith("instance 0 caught at"))
    assert "instance 1 failed: ZeroDivisionError: instance 1 gives up" in caught
    assert float(caught.split()[4].rstrip(":")) - failed_at < 5.0


PARTS = ["dp", "rts", "hierarchical", "cases", "host-shapes", "weights"]


# --- MPI ------------------------------------------------------------------------------------
@needs_mpi
def test_poprun_two_instances_of_four_replicas(tmp_path, dp_reference, tp2d_reference):
    res = poprun("--num-instances", "2", "--num-replicas", "4", sys.executable, SUITE,
                 f"dp={tmp_path}", "rts", "hierarchical", "cases", "host-shapes", "weights",
                 "mpi-user",
                 "instance0-io", "fail-last")
    assert_suite(res, "[1,{i}]<{stream}>: ", 2, PARTS + ["mpi-user", "instance0-io"])
    assert_dp_bitwise(tmp_path, dp_reference)
    for i in range(2):          # the 2-D TP cases over 2 instances of 4: the same bits
        assert f"tp2d digest {tp2d_reference}" in lines_of(res.stdout, f"[1,{i}]<stdout>: ")
    # The documented values of the hierarchical all-reduce, on each instance's 4 replicas.
    want = "[[0.0, 4.0, 8.0, 12.0], [16.0, 20.0, 24.0, 28.0], [0.0, 4.0, 8.0, 12.0], " \
           "[16.0, 20.0, 24.0, 28.0]]"
    for i in range(2):
        out = lines_of(res.stdout, f"[1,{i}]<stdout>: ")
        assert sum(line.startswith("ok hierarchical") and line.endswith(want)
                   for line in out) == 2, out
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


@needs_mpi
def test_plain_mpiexec_four_instances_trains_bitwise(tmp_path, dp_reference):
    res = launch([os.path.join(BIN, "mpiexec"), "-n", "4", sys.executable, DP, *DP_ARGS,
                  "--save-losses", str(tmp_path), "--save-weights",
                  str(tmp_path / "weights.npz")])
    assert res.returncode == 0, res.text[-4000:]
    assert "Training: 4 replicas (4 instance(s) x 1)" in res.stdout
    assert res.stdout.count("Accuracy on test set:") == 1       # instance 0 only
    assert_dp_bitwise(tmp_path, dp_reference)


@needs_mpi
def test_poprun_eight_instances_of_sixteen_replicas_rts_with_groupings():
    res = poprun("--num-instances", "8", "--num-replicas", "128", "--print-topology", "yes",
                 sys.executable, RTS, "--groupings", OPENBLAS_NUM_THREADS="1")
    assert res.returncode == 0, res.text[-4000:]
    assert "| instances |" in res.stdout and "| 127 |" in res.stdout
    for i in range(8):
        got = lines_of(res.stdout, f"[1,{i}]<stdout>: ")
        assert len([x for x in got if x.startswith("ok R128 rts[")]) == 5, (i, got)


def _failure(scenario: str, **env):
    t0 = time.monotonic()
    res = poprun("--num-instances", "2", sys.executable, FAILURES, scenario, timeout=120,
                 **env)
    res.took = time.monotonic() - t0
    res.zero = lines_of(res.stdout, "[1,0]<stdout>: ")
    return res


def _no_segment_left(res) -> None:
    """Instance 0 reported the MPICH shared-memory segment of the job: it must be gone (it is
    unlinked once every instance mapped it, so a killed or aborted job cannot leave it)."""
    line = next((x for x in res.zero if x.startswith("segments=")), None)
    assert line is not None, res.text[-3000:]
    segments = [s for s in line[len("segments="):].split(",") if s]
    assert segments, "instance 0 maps no MPICH segment"
    assert not [s for s in segments if os.path.exists(s)], segments


def _caught(res, kind: str) -> tuple:
    line = next((x for x in res.zero if x.startswith(f"caught {kind}")), None)
    assert line is not None, res.text[-4000:]
    return float(line.split()[3]), line


@needs_mpi
def test_an_instance_that_dies_is_named_and_its_exit_code_returned():
    res = _failure("kill")
    took, line = _caught(res, "WorkerDied")
    assert "instance 1 (MPI rank 1, pid" in line and "died" in line
    assert took < 5.0
    assert "poprun: instance 1 was killed by signal 9 (SIGKILL)" in res.stdout + res.stderr
    assert res.returncode == 137, res.text[-3000:]
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)
    _no_segment_left(res)


@needs_mpi
def test_a_goodbye_read_before_the_data_sent_ahead_of_it_is_not_taken_for_an_exit():
    res = poprun("--num-instances", "2", sys.executable,
                 os.path.join(HERE, "instance_goodbye.py"), timeout=120)
    assert res.returncode == 0, res.text[-3000:]
    assert "got 100000 values" in lines_of(res.stdout, "[1,0]<stdout>: "), res.text[-3000:]


@needs_mpi
def test_an_instance_that_exits_early_is_named_and_its_exit_code_returned():
    res = _failure("exit")
    took, line = _caught(res, "InstanceFailed")
    assert "instance 1 ended its script without joining this collective" in line
    assert took < 5.0 and res.returncode == 3, res.text[-3000:]


@needs_mpi
def test_instances_that_diverge_or_build_different_programs_are_told_so():
    res = _failure("mismatch-diverge")
    assert res.returncode == 0, res.text[-3000:]
    for i, other in ((0, 1), (1, 0)):
        caught = [x for x in lines_of(res.stdout, f"[1,{i}]<stdout>: ")
                  if x.startswith("caught")]
        assert len(caught) == 3, (i, caught)
        assert caught[0].startswith("caught ValueError: popdist instance "
                                    f"{other} built a different program than instance {i}")
        assert caught[1].startswith("caught InstanceFailed: instance "
                                    f"{other} is in another collective"), caught[1]
        assert "diverged" in caught[1]
        assert caught[2].startswith("caught RuntimeError") and "after a failed one" in caught[2]


@needs_mpi
def test_a_hanging_instance_times_out_and_the_job_ends():
    res = _failure("hang", POPXL_COLLECTIVE_TIMEOUT="2")
    took, line = _caught(res, "CollectiveTimeout")
    assert "ReplicatedAllReduce" in line and "waiting for worker 1 (replica 1)" in line
    assert "no data from instance(s) [1] within 2 s" in line
    assert 1.5 < took < 10 and res.took < 60, res.text[-3000:]
    assert res.returncode == 1
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)
    _no_segment_left(res)


@needs_mpi
def test_an_instance_failing_before_its_session_stops_the_job():
    res = _failure("early")
    assert "poprun: instance 1 failed (exit code 1); stopping the other instances" in res.stderr
    assert res.returncode == 1 and res.took < 60, res.text[-3000:]
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


@needs_mpi
def test_under_plain_mpiexec_an_instance_failing_before_its_session_aborts_the_job():
    """...and leaves no MPICH segment in /dev/shm (MPI_Abort used to leave it every time): the
    job's segments are read from its processes' memory maps while it runs."""
    t0 = time.monotonic()
    proc = subprocess.Popen([os.path.join(BIN, "mpiexec"), "-n", "2", sys.executable, FAILURES,
                             "early-ir"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(), cwd=ROOT, start_new_session=True)
    out: list = []
    reader = threading.Thread(target=lambda: out.append(proc.communicate()[0]))
    reader.start()
    segments: set = set()
    while reader.is_alive() and time.monotonic() - t0 < 120:
        segments |= mapped_files(tree_pids(proc.pid), "/dev/shm/mpich_shm_")
    if reader.is_alive():
        os.killpg(proc.pid, signal.SIGKILL)
    reader.join()
    text = out[0]
    assert proc.returncode != 0 and time.monotonic() - t0 < 60, text[-3000:]
    assert "RuntimeError: instance 1 fails before its Session" in text
    assert "popxl: MPI rank 1 failed before its first popdist Session: aborting the MPI job" \
        in text, text[-3000:]
    assert wait_until(lambda: not job_processes(proc.pid)), job_processes(proc.pid)
    assert segments, "the job's processes mapped no MPICH segment"
    assert not [s for s in segments if os.path.exists(s)], segments


def _interrupt(cmd) -> str:
    """Ctrl-C (SIGINT to the launch's process group) during a long run stops everything, even
    when the launcher inherited SIGINT ignored (a background command of a CI runner); the
    output after it (one line from the launcher, one per instance: nothing like a crash)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(), cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            if line.rstrip().endswith("running"):
                break
            assert time.monotonic() < deadline, "the long run never started"
        else:
            raise AssertionError("the long run ended before it was interrupted")
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        rest = proc.communicate(timeout=60)[0]
        assert time.monotonic() - t0 < 20
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert wait_until(lambda: not job_processes(proc.pid)), job_processes(proc.pid)
    for crash in ("Traceback", "Segmentation fault", "YOUR APPLICATION TERMINATED", "signal"):
        assert crash not in rest, rest[-3000:]
    return rest


@needs_mpi
def test_ctrl_c_stops_every_instance():
    rest = _interrupt([sys.executable, "-m", "popxl_launch.poprun", "--num-instances", "2",
                       sys.executable, FAILURES, "sleep"])
    assert "poprun: interrupted (Ctrl-C); stopping the instances" in rest, rest
    for i in range(2):
        assert f"[1,{i}]<stderr>: popxl: instance {i} interrupted (Ctrl-C)" in rest, rest


def assert_debug(res, prefix: str, directory) -> None:
    """instance_debug.py's run: instance 1 stopped at the NaN's origin, instance 0 told so; the
    bundles both instances wrote replay here, in one process: the error, and a good run's
    outputs bitwise."""
    from popxl.debug import replay

    zero = lines_of(res.stdout, prefix.format(i=0, stream="stdout"))
    assert "ok debug" in zero, res.text[-5000:]
    assert res.returncode == 1, res.text[-3000:]        # instance 1's uncaught error
    assert "NonFiniteError: Log." in res.text and "replica 3, run 3" in res.text, res.text[-3000:]
    good = next(x for x in zero if x.startswith("good-bundle ")).split()[1]
    failed = replay(os.path.join(directory, "session0-run3"))
    assert "replica 3, run 3" in str(failed.error), failed.error
    assert replay(good).identical


@needs_mpi
def test_poprun_debugging_across_instances(tmp_path):
    res = poprun("--num-instances", "2", "--num-replicas", "4", sys.executable, DEBUG,
                 str(tmp_path), timeout=120)
    assert_debug(res, "[1,{i}]<{stream}>: ", tmp_path)


# --- Ray ------------------------------------------------------------------------------------
@needs_ray
def test_ray_two_instances_of_four_replicas(tmp_path, dp_reference):
    res = popxl_run("--backend", "ray", "--instances", "2", "--replicas", "4", SUITE,
                    f"dp={tmp_path}", "rts", "hierarchical", "cases", "host-shapes", "weights",
                    "fail-last",
                    timeout=600)
    assert_suite(res, "[instance {i}] ", 2, PARTS)
    assert_dp_bitwise(tmp_path, dp_reference)
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


@needs_ray
def test_ray_debugging_across_instances(tmp_path):
    res = popxl_run("--backend", "ray", "--instances", "2", "--replicas", "4", DEBUG,
                    str(tmp_path), timeout=300)
    assert_debug(res, "[instance {i}] ", tmp_path)


@needs_ray
def test_ray_instance_that_dies_is_named():
    res = popxl_run("--backend", "ray", "--instances", "2", FAILURES, "kill", timeout=300)
    zero = lines_of(res.stdout, "[instance 0] ")
    # WorkerDied, as under MPI, whether the launcher's notice or the link's closing comes first
    line = next((x for x in zero if x.startswith("caught ")), None)
    assert line is not None, res.text[-4000:]
    assert line.startswith("caught WorkerDied") and "instance 1 (Ray actor, pid" in line, line
    assert "died" in line and float(line.split()[3]) < 5.0
    assert "popxl-run: instance 1 (Ray actor, pid" in res.stderr and "died" in res.stderr
    assert res.returncode == 1, res.text[-3000:]
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


@needs_ray
def test_ray_ctrl_c_leaves_no_actors():
    _interrupt([sys.executable, "-m", "popxl_launch", "--backend", "ray", "--instances", "2",
                FAILURES, "sleep"])
