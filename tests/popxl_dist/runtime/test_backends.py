"""Every backend with real workers: collectives, tensor-parallel ops and remote buffers / RTS on
1 to 8 replicas (stride > 1 groups included), failures surfacing in the host, bitwise-identical
training on local / mpi / ray and any worker count, and no processes left behind. Process starts
are few: one `popxl-run` per backend for the bulk, plus the crash and Ctrl-C runs."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import collective_cases
import failure_cases
import fp8_cases
import remote_cases
import tp_cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SUITE = os.path.join(HERE, "backend_suite.py")
FAILURES = os.path.join(HERE, "failure_cases.py")
EXAMPLE = os.path.join(ROOT, "examples", "mnist_data_parallel.py")

HAVE_MPI = (importlib.util.find_spec("mpi4py") is not None
            and os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")))
HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray not installed")


def popxl_run(backend: str, workers: int, *args: str, timeout: float = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    return subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", backend,
                           "--workers", str(workers), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def our_processes(marker: str) -> list:
    """Processes whose command line mentions `marker` (leftover workers)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if marker in line and "ps -eo" not in line]


def ray_processes() -> list:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:]
            if ("raylet" in line or "ray::" in line or "gcs_server" in line)]


def wait_until(condition, timeout: float = 20.0) -> bool:
    """Poll `condition` (process teardown takes a moment after the host exits)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def assert_suite_ok(res) -> None:
    fails = "\n".join(line for line in res.stdout.splitlines() if "FAIL" in line)
    text = fails + "\n...\n" + (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0, text
    assert "FAIL" not in res.stdout, text[-4000:]
    assert "suite: 0 failed part(s)" in res.stdout, text[-4000:]


def load_weights(path) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), f"weight {k} differs"


# --- local backend, in process ---------------------------------------------------------
@pytest.mark.parametrize("workers", [None, "2", "3"])
def test_collective_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert collective_cases.main() == 0, capsys.readouterr().out[-3000:]


@pytest.mark.parametrize("workers", [None, "2", "3"])
def test_tp_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert tp_cases.main() == 0, capsys.readouterr().out[-3000:]


@pytest.mark.parametrize("workers", [None, "3"])
def test_remote_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert remote_cases.main() == 0, capsys.readouterr().out[-3000:]


@pytest.mark.parametrize("workers", [None, "3"])
def test_fp8_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert fp8_cases.main() == 0, capsys.readouterr().out[-3000:]


@pytest.mark.parametrize("workers", [None, "2"])
def test_failures_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert failure_cases.main(["error", "diverge"]) == 0, capsys.readouterr().out


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory):
    """The reference: the short data-parallel run with every replica in this process."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import mnist_data_parallel

    path = tmp_path_factory.mktemp("dp") / "local.npz"
    mnist_data_parallel.main(["--limit", "6", "--test-batches", "2", "--no-progress",
                              "--save-weights", str(path)])
    return load_weights(path)


@pytest.fixture(scope="module")
def local_gpt_losses(tmp_path_factory):
    """The tensor-parallel GPT example's losses (TP=2 x DP=2, then TP=1 x DP=2) in process."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import backend_suite
    import gpt_tiny_tp

    path = tmp_path_factory.mktemp("gpt") / "local.npy"
    assert gpt_tiny_tp.main(backend_suite.GPT_ARGS + ["--save-losses", str(path)]) == 0
    return np.load(path)


def test_worker_threads_train_bitwise_like_one_worker(monkeypatch, tmp_path, local_weights):
    import mnist_data_parallel

    monkeypatch.setenv("POPXL_WORKERS", "2")
    path = tmp_path / "threads.npz"
    mnist_data_parallel.main(["--limit", "6", "--test-batches", "2", "--no-progress",
                              "--save-weights", str(path)])
    assert_bitwise_equal(load_weights(path), local_weights)


# --- mpi -------------------------------------------------------------------------------
@needs_mpi
def test_mpi_two_ranks_cases_failures_and_bitwise_training(tmp_path, local_weights,
                                                           local_gpt_losses):
    path, gpt = tmp_path / "mpi.npz", tmp_path / "gpt.npy"
    res = popxl_run("mpi", 2, SUITE, "--dp-weights", str(path), "--gpt-losses", str(gpt),
                    "--failures", "error,diverge")
    assert_suite_ok(res)
    assert_bitwise_equal(load_weights(path), local_weights)
    assert "Accuracy on test set:" in res.stdout
    assert "TP=2 vs TP=1 losses" in res.stdout
    assert np.load(gpt).tobytes() == local_gpt_losses.tobytes()
    assert wait_until(lambda: not our_processes(SUITE))


@needs_mpi
def test_mpi_three_ranks_uneven_blocks(tmp_path, local_weights):
    path = tmp_path / "mpi3.npz"
    res = popxl_run("mpi", 3, SUITE, "--dp-weights", str(path))
    assert_suite_ok(res)
    assert_bitwise_equal(load_weights(path), local_weights)


@needs_mpi
def test_mpi_dead_worker_raises_in_host_and_leaves_nothing():
    res = popxl_run("mpi", 2, FAILURES, "crash", timeout=60)
    out = res.stdout + res.stderr
    assert "ok crash" in res.stdout, out[-3000:]
    assert "worker 1 held replica 1" in res.stdout, out[-3000:]
    assert res.returncode == 0, out[-3000:]      # the script's exit code, not the abort's
    assert wait_until(lambda: not our_processes(FAILURES))


@needs_mpi
def test_mpi_script_exit_code_is_returned(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(3)\n")
    res = popxl_run("mpi", 2, str(script), "a", "--b")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "args ['a', '--b']" in res.stdout


def _interrupt(backend: str, workers: int, marker_processes) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    proc = subprocess.Popen([sys.executable, "-m", "popxl_launch", "--backend", backend,
                             "--workers", str(workers), FAILURES, "sleep"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            if line.startswith("running"):
                break
            assert time.monotonic() < deadline, "the long run never started"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)           # what Ctrl-C in a terminal does
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert wait_until(lambda: not marker_processes())


@needs_mpi
def test_mpi_ctrl_c_stops_every_rank():
    _interrupt("mpi", 2, lambda: our_processes(FAILURES))


# --- ray -------------------------------------------------------------------------------
@needs_ray
def test_ray_cases_failures_crash_and_bitwise_training(tmp_path, local_weights):
    before = len(ray_processes())
    path = tmp_path / "ray.npz"
    res = popxl_run("ray", 2, SUITE, "--dp-weights", str(path),
                    "--failures", "error,diverge,crash")
    assert_suite_ok(res)
    assert "worker 1 held replica 1" in res.stdout
    assert_bitwise_equal(load_weights(path), local_weights)
    assert wait_until(lambda: len(ray_processes()) <= before), ray_processes()


@needs_ray
def test_ray_ctrl_c_leaves_no_actors():
    before = len(ray_processes())
    _interrupt("ray", 2, lambda: len(ray_processes()) > before)
