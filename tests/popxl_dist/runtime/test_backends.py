"""Every backend with real workers: collectives, tensor-parallel ops and remote buffers / RTS on
1 to 8 replicas (stride > 1 groups included), failures surfacing in the host, bitwise-identical
training on local / mpi / ray and any worker count, and no processes left behind. Process starts
are few: one `popxl-run` per backend for the bulk, plus the crash and Ctrl-C runs."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import collective_cases
import debug_cases
import failure_cases
import fp8_cases
import remote_cases
import surface_cases
import tp_cases
import tp2d_cases
from procs import run_in_session, wait_until
from procs import session_processes as job_processes

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


def popxl_run(backend: str, workers: int, *args: str, timeout: float = 240, env=None):
    """Run popxl-run in a new session (so `job_processes(res.sid)` finds what it left), with
    extra environment variables `env`."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}, **(env or {})}
    return run_in_session([sys.executable, "-m", "popxl_launch", "--backend", backend,
                           "--workers", str(workers), *args], env, ROOT, timeout)


def our_processes(marker: str) -> list:
    """Processes whose command line mentions `marker` (leftover workers)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if marker in line and "ps -eo" not in line]


def job_segments(driver_pid: int) -> list:
    """The shared-memory segments the Ray backend created for the driver `driver_pid`."""
    return glob.glob(f"/dev/shm/popxl-ray-{driver_pid}-*")


def nothing_left(sid: int) -> bool:
    """No live process of the job (session `sid`, whose leader is the driver) and no segment."""
    return not job_processes(sid) and not job_segments(sid)


def assert_suite_ok(res) -> None:
    fails = "\n".join(line for line in res.stdout.splitlines() if "FAIL" in line)
    text = fails + "\n...\n" + (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0, text
    assert "FAIL" not in res.stdout, text[-4000:]
    assert "suite: 0 failed part(s)" in res.stdout, text[-4000:]
    # floating-point events on the device give IEEE results silently, in every worker
    assert "RuntimeWarning" not in res.stderr, res.stderr[-3000:]


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


@pytest.fixture(scope="module")
def tp2d_digest():
    """The 2-D tensor-parallel cases' digest with every replica in this process, one worker."""
    results, digest = tp2d_cases.run()
    assert not [r for r in results if r[1]], results
    return digest


def test_tp2d_cases_bitwise_on_local_worker_threads(monkeypatch, tp2d_digest):
    monkeypatch.setenv("POPXL_WORKERS", "3")           # blocks of 3, 3, 2 replicas
    results, digest = tp2d_cases.run()
    assert not [r for r in results if r[1]], results
    assert digest == tp2d_digest


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
def test_surface_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert surface_cases.main() == 0, capsys.readouterr().out[-3000:]


@pytest.mark.parametrize("workers", [None, "2"])
def test_failures_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert failure_cases.main(["error", "diverge"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("workers", [None, "2"])
def test_debug_cases_on_local_backend(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert debug_cases.main() == 0, capsys.readouterr().out[-3000:]


def assert_bundles_replay(path) -> None:
    """The bundles the debug cases recorded on other workers replay here, in this one
    process: the failing run raises the same error, the good run gives its outputs bitwise."""
    from popxl.debug import replay

    with open(path) as f:
        bundles = json.load(f)
    failed = replay(bundles["failed"])
    assert failed.error is not None
    assert str(failed.error).splitlines()[0] == bundles["error"], (failed.error,
                                                                   bundles["error"])
    good = replay(bundles["good"])
    assert good.error is None and good.identical, good
    assert np.array_equal(next(iter(good.outputs.values()))[0],
                          np.asarray(bundles["good_outputs"], np.float32))


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
                                                           local_gpt_losses, tp2d_digest):
    path, gpt, bundles = tmp_path / "mpi.npz", tmp_path / "gpt.npy", tmp_path / "bundles.json"
    res = popxl_run("mpi", 2, SUITE, "--dp-weights", str(path), "--gpt-losses", str(gpt),
                    "--failures", "error,diverge", "--debug-bundles", str(bundles))
    assert_suite_ok(res)
    assert_bundles_replay(bundles)
    assert_bitwise_equal(load_weights(path), local_weights)
    assert "Accuracy on test set:" in res.stdout
    assert "TP=2 vs TP=1 losses" in res.stdout
    assert np.load(gpt).tobytes() == local_gpt_losses.tobytes()
    assert f"tp2d digest {tp2d_digest}" in res.stdout
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


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
    assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)


@needs_mpi
def test_mpi_script_exit_code_is_returned(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(3)\n")
    res = popxl_run("mpi", 2, str(script), "a", "--b")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "args ['a', '--b']" in res.stdout


def _start_sleeper(backend: str, workers: int) -> subprocess.Popen:
    """popxl-run of the long `sleep` scenario, in a new session, with SIGINT ignored as a
    command run in the background by a non-interactive shell (a CI runner) has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    return subprocess.Popen([sys.executable, "-m", "popxl_launch", "--backend", backend,
                             "--workers", str(workers), FAILURES, "sleep"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def _wait_running(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        if line.startswith("running"):
            time.sleep(0.5)
            return
        assert time.monotonic() < deadline, "the long run never started"
    raise AssertionError("the long run ended before it was interrupted")


def _kill_job(proc: subprocess.Popen) -> None:
    """Whatever happened, leave nothing of the job running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for line in job_processes(proc.pid):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass


def _interrupt(backend: str, workers: int) -> None:
    """Ctrl-C a long run and check that the whole job stops, even though popxl-run started
    with SIGINT ignored, saying so in one line and with nothing that looks like a crash (hydra
    used to print `... EXIT STRING: Segmentation fault (signal 11)`: the OR of the ranks'
    wait statuses SIGKILL | SIGINT)."""
    proc = _start_sleeper(backend, workers)
    try:
        _wait_running(proc)
        os.killpg(proc.pid, signal.SIGINT)           # what Ctrl-C in a terminal does
        t0 = time.monotonic()
        rest = proc.communicate(timeout=30)[0]
        assert time.monotonic() - t0 < 15
        assert proc.returncode == 130, rest[-3000:]
        assert "popxl-run: failure_cases.py interrupted (Ctrl-C)" in rest, rest[-3000:]
        for crash in ("Traceback", "Segmentation fault", "YOUR APPLICATION TERMINATED",
                      "signaled", "BAD TERMINATION"):
            assert crash not in rest, rest[-3000:]
        assert wait_until(lambda: nothing_left(proc.pid)), (job_processes(proc.pid),
                                                           job_segments(proc.pid))
    finally:
        _kill_job(proc)


@needs_mpi
def test_mpi_ctrl_c_stops_every_rank():
    _interrupt("mpi", 2)


# --- ray -------------------------------------------------------------------------------
@needs_ray
def test_ray_cases_failures_crash_and_bitwise_training(tmp_path, local_weights,
                                                       local_gpt_losses, tp2d_digest):
    path, gpt, bundles = tmp_path / "ray.npz", tmp_path / "gpt.npy", tmp_path / "bundles.json"
    res = popxl_run("ray", 2, SUITE, "--dp-weights", str(path), "--gpt-losses", str(gpt),
                    "--failures", "error,diverge,crash", "--debug-bundles", str(bundles))
    assert_suite_ok(res)
    assert_bundles_replay(bundles)
    assert "worker 1 held replica 1" in res.stdout
    assert_bitwise_equal(load_weights(path), local_weights)
    assert np.load(gpt).tobytes() == local_gpt_losses.tobytes()
    assert f"tp2d digest {tp2d_digest}" in res.stdout
    assert wait_until(lambda: nothing_left(res.sid)), (job_processes(res.sid),
                                                      job_segments(res.sid))


@needs_ray
def test_ray_sockets_three_workers_killed_and_stopped_workers(tmp_path, local_weights):
    """Sockets between every worker (as between nodes), 3 workers: the bitwise training, a
    worker killed while every replica computes a long loop without collectives (reported
    within 2 s by the watchdog), a worker stopped (CollectiveTimeout naming the op, the replicas
    and the silent worker at the timeout; the session left at once)."""
    path = tmp_path / "ray3.npz"
    res = popxl_run("ray", 3, SUITE, "--no-cases", "--dp-weights", str(path),
                    "--failures", "crash_long,stall",
                    env={"POPXL_RAY_TRANSPORT": "socket", "POPXL_COLLECTIVE_TIMEOUT": "5"})
    assert_suite_ok(res)
    assert "crash_long reported" in res.stdout and "stall: CollectiveTimeout" in res.stdout
    assert_bitwise_equal(load_weights(path), local_weights)
    assert wait_until(lambda: nothing_left(res.sid)), (job_processes(res.sid),
                                                      job_segments(res.sid))


@needs_ray
def test_ray_ctrl_c_leaves_no_actors():
    _interrupt("ray", 2)


@needs_ray
def test_ray_sigkill_to_the_launcher_leaves_nothing():
    """SIGKILL to popxl-run alone (not its group): Ray's fate-sharing takes the raylet and GCS
    down; the reaper takes the agents and actors, and any segment."""
    proc = _start_sleeper("ray", 2)
    try:
        _wait_running(proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: nothing_left(proc.pid)), (job_processes(proc.pid),
                                                           job_segments(proc.pid))
    finally:
        _kill_job(proc)
