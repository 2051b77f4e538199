"""The installed console scripts as a newcomer meets them (`popxl-run`, `poprun`, run in
subprocesses): no arguments, the help texts, one line and exit status 2 for a backend whose extra
is not installed (a clear ModuleNotFoundError inside a script), and the note for more worker
processes than CPUs.

A missing extra is simulated by hiding its modules from the subprocess: a `sitecustomize.py` on
PYTHONPATH sets `sys.modules[name] = None` for each name in `HIDE_MODULES`, so `import name`
raises ModuleNotFoundError and `importlib.util.find_spec(name)` returns None, as when the package
is not installed. (The mpich wheel's `mpiexec` stays beside the interpreter, so the mpi message
names mpi4py alone; the message for a missing mpiexec is tested in test_cli.py.)"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = os.path.dirname(sys.executable)
ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "mnist.yaml")
CLONE = "in the popxl-dist clone"
MPI_HINT = f'mpi4py is not installed (the mpi extra: pip install -e ".[mpi]" {CLONE})'
RAY_HINT = f'Ray is not installed (the ray extra: pip install -e ".[ray]" {CLONE})'
SCRIPT = """\
import numpy as np, popxl
ir = popxl.Ir(replication=2)
with ir.main_graph:
    popxl.variable(np.ones(2, np.float32))
with popxl.Session(ir, "ipu_hw"):
    pass
print("ran")
"""
HIDE = """\
import os, sys
for name in os.environ.get("HIDE_MODULES", "").split(","):
    if name:
        sys.modules[name] = None
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(HIDE)
    (tmp / "script.py").write_text(SCRIPT)
    return tmp


def run(cmd, hide=(), files=None, env=None, one_cpu=False, timeout=120):
    """`cmd` with the console scripts of this Python first on PATH; `hide` names modules the
    subprocess must not find; `one_cpu` pins it (and its children) to one CPU."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("POPXL_", "POPDIST_"))}
    full["PATH"] = BIN + os.pathsep + full.get("PATH", "")
    if hide:
        full["PYTHONPATH"] = str(files / "site")
        full["HIDE_MODULES"] = ",".join(hide)
    full.update(env or {})
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_cpu else None
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=str(files or ROOT),
                          timeout=timeout, preexec_fn=pin)


def test_no_arguments_says_what_to_run():
    res = run(["popxl-run"])
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("usage: popxl-run")          # argparse's usage, then one line
    hint = res.stderr.splitlines()[-1]
    assert hint.startswith("popxl-run: give a PopXL script or a job config to run, e.g. "
                           "`popxl-run configs/mnist.yaml`")
    assert "required" not in res.stderr


def test_config_help_shows_the_files_values():
    res = run(["popxl-run", CONFIG, "--help"])
    assert res.returncode == 0 and res.stderr == ""
    for text in ("train.global_batch (128) [default: 64]", "train.epochs (30) [default: 1]",
                 "train.sgd.lr (0.1) [default: 0.05]", "test.eval_every (195) [default: 0]"):
        assert text in res.stdout, text


def test_poprun_help_describes_every_option():
    res = run(["poprun", "--help"])
    assert res.returncode == 0
    options = [line.split()[0] for line in res.stdout.splitlines()
               if line.startswith("  -")]
    assert "--ipus-per-replica" in options and "--print-topology" in options
    text = " ".join(res.stdout.split())
    assert "--ipus-per-replica N IPUs each replica spans" in text
    assert "--print-topology yes|no print the table of hosts, instances and replicas" in text
    for option in options:                # each option is followed by its help
        after = text.split(f" {option} ", 1)[1].split(" --", 1)[0]
        assert len(after.split()) >= 2, (option, after)


@pytest.mark.parametrize("cmd,prog,hint", [
    (["popxl-run", "--backend", "mpi", "script.py"], "popxl-run", f"--backend mpi: {MPI_HINT}"),
    (["popxl-run", "--backend", "ray", "script.py"], "popxl-run", f"--backend ray: {RAY_HINT}"),
    (["popxl-run", "--backend", "mpi", CONFIG], "popxl-run", f"--backend mpi: {MPI_HINT}"),
    (["popxl-run", "--backend", "ray", CONFIG], "popxl-run", f"--backend ray: {RAY_HINT}"),
    (["popxl-run", "--backend", "mpi", "--instances", "2", "script.py"], "popxl-run",
     f"--backend mpi: {MPI_HINT}"),
    (["popxl-run", "--backend", "ray", "--instances", "2", "script.py"], "popxl-run",
     f"--backend ray: {RAY_HINT}"),
    (["poprun", "--num-instances", "2", "python", "script.py"], "poprun", f"error: {MPI_HINT}"),
], ids=["mpi-script", "ray-script", "mpi-job", "ray-job", "mpi-instances", "ray-instances",
        "poprun"])
def test_missing_backend_is_one_line_naming_the_extra(files, cmd, prog, hint):
    res = run(cmd, hide=("mpi4py", "ray"), files=files)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr == f"{prog}: {hint}\n"
    assert res.stderr.count(prog) == 1


@pytest.mark.parametrize("backend,hint", [("mpi", MPI_HINT), ("ray", RAY_HINT)])
def test_missing_backend_in_a_script_is_a_clear_import_error(files, backend, hint):
    """`POPXL_BACKEND=B python script.py`: the Session raises ModuleNotFoundError, with no
    chained traceback of the import that failed."""
    res = run([sys.executable, "script.py"], hide=("mpi4py", "ray"), files=files,
              env={"POPXL_BACKEND": backend})
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == f"ModuleNotFoundError: POPXL_BACKEND={backend}: {hint}"
    assert "During handling" not in res.stderr and res.stderr.count("Traceback") == 1


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None
                    or not os.path.exists(os.path.join(BIN, "mpiexec")),
                    reason="mpi4py / mpich not installed")
@pytest.mark.parametrize("cmd,note", [
    (["popxl-run", "--backend", "mpi", "--workers", "2", "script.py"],
     "popxl-run: note: 2 MPI ranks on 1 usable CPU share the cores"),
    (["popxl-run", "--backend", "mpi", "--instances", "2", "--replicas", "2", "script.py"],
     "popxl-run: note: 2 instances on 1 usable CPU share the cores"),
    (["poprun", "--num-instances", "2", "--num-replicas", "2", "python", "script.py"],
     "poprun: note: 2 instances on 1 usable CPU share the cores"),
], ids=["workers", "instances", "poprun"])
def test_more_processes_than_cpus_run_with_a_note(files, cmd, note):
    """One rule for every launcher (the YAML job too: test_cli.py): more worker processes than
    usable CPUs are started, with one note line on stderr."""
    res = run(cmd, files=files, one_cpu=True)
    assert res.returncode == 0, res.stderr
    assert f"{note} (slower; the results are the same)" in res.stderr.splitlines()
    assert res.stdout.count("ran") == (1 if "--workers" in cmd else 2)
