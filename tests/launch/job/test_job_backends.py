"""`popxl-run --backend mpi|ray --workers 2 configs/mnist.yaml` (a short run): the same weights
digest and accuracy as the local backend, and on mpi a run stopped and resumed ends with the
uninterrupted weights. Process starts are few: three `mpiexec` launches, one Ray start."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest

from test_job_cli import CONFIG, ROOT, SHORT, accuracy_of, digest_of

from popxl_launch.cli import main

sys.path.insert(0, str(ROOT / "tests" / "popxl_dist" / "runtime"))
from test_backends import job_processes, needs_mpi, needs_ray, nothing_left, \
    our_processes, wait_until  # noqa: E402
from test_backends import popxl_run as popxl_run_in_session  # noqa: E402


def popxl_run(backend: str, *args: str, timeout: float = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    return subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", backend,
                           "--workers", "2", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(digest, accuracy) of the short run with every replica in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([CONFIG, "--run-dir", str(tmp_path_factory.mktemp("local") / "r"), *SHORT])
    assert code == 0
    return digest_of(out.getvalue()), accuracy_of(out.getvalue())


def check(res, local) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert (digest_of(res.stdout), accuracy_of(res.stdout)) == local, out[-3000:]


@needs_mpi
def test_mpi_matches_local_and_resumes_bitwise(tmp_path, local):
    full = tmp_path / "full"
    check(popxl_run("mpi", CONFIG, "--run-dir", str(full), *SHORT), local)
    assert wait_until(lambda: not our_processes(str(full)))

    stopped = tmp_path / "stopped"
    res = popxl_run("mpi", CONFIG, "--run-dir", str(stopped), *SHORT, "--stop-at-step", "7")
    assert res.returncode == 0 and "Stopped at step 7" in res.stdout, res.stdout + res.stderr
    res = popxl_run("mpi", CONFIG, "--resume", str(stopped), *SHORT)
    assert "at step 7" in res.stdout, res.stdout + res.stderr
    check(res, local)
    assert wait_until(lambda: not our_processes(str(stopped)))


@needs_mpi
def test_mpi_default_run_folder_is_chosen_once(tmp_path):
    """The launcher names the run folder and rank 0 writes exactly that one."""
    res = subprocess.run([sys.executable, "-m", "popxl_launch", "--backend", "mpi",
                          "--workers", "2", CONFIG, *SHORT, "--set", "train.steps=1",
                          "--set", "test.limit=100"], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("POPXL_")})
    assert res.returncode == 0, res.stdout + res.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    assert f"Run folder: runs/{folder.name}" in res.stdout


@needs_ray
def test_ray_matches_local(tmp_path, local):
    res = popxl_run_in_session("ray", 2, CONFIG, "--run-dir", str(tmp_path / "ray"), *SHORT)
    check(res, local)
    assert wait_until(lambda: nothing_left(res.sid)), job_processes(res.sid)
