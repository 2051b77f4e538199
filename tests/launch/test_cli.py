"""`popxl-run` with the local backend, in process: environment, arguments, exit codes."""
import os

import pytest

from popxl_launch.cli import main


@pytest.fixture(autouse=True)
def restore_env(monkeypatch):
    for var in ("POPXL_BACKEND", "POPXL_WORKERS"):
        monkeypatch.delenv(var, raising=False)
    yield


def write(tmp_path, text):
    path = tmp_path / "script.py"
    path.write_text(text)
    return str(path)


def test_runs_the_script_as_main_with_its_arguments(tmp_path, capsys):
    script = write(tmp_path, "import os, sys\n"
                             "print(__name__, sys.argv[1:], os.environ['POPXL_BACKEND'], "
                             "os.environ['POPXL_WORKERS'])\n")
    assert main(["--workers", "3", script, "x", "--flag", "1"]) == 0
    assert capsys.readouterr().out.strip() == "__main__ ['x', '--flag', '1'] local 3"


def test_exit_code_is_the_scripts(tmp_path):
    assert main([write(tmp_path, "import sys\nsys.exit(7)\n")]) == 7
    assert main([write(tmp_path, "raise SystemExit('bad')\n")]) == 1


def test_uncaught_exception_prints_traceback_and_returns_1(tmp_path, capsys):
    assert main([write(tmp_path, "raise ValueError('boom')\n")]) == 1
    assert "ValueError: boom" in capsys.readouterr().err


def test_bad_targets(tmp_path, capsys):
    assert main([str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err
    assert main(["--workers", "0", write(tmp_path, "pass\n")]) == 2


def test_replicated_program_under_local_workers(tmp_path, capsys):
    script = write(tmp_path, """
import numpy as np, popxl, popxl.ops as ops
ir = popxl.Ir(replication=4)
with ir.main_graph:
    s = popxl.h2d_stream((2,), popxl.float32, "x")
    y = ops.collectives.replicated_all_reduce(ops.host_load(s), op="max")
    o = popxl.d2h_stream((2,), popxl.float32, "y")
    ops.host_store(o, y)
with popxl.Session(ir, "ipu_hw") as sess:
    out = sess.run({s: np.arange(8, dtype=np.float32).reshape(4, 2)})[o]
print(out.tolist())
""")
    assert main(["--backend", "local", "--workers", "2", script]) == 0
    assert capsys.readouterr().out.strip() == str([[6.0, 7.0]] * 4)
    assert os.environ["POPXL_WORKERS"] == "2"


def test_missing_mpi_names_what_is_missing_and_the_extra(monkeypatch, tmp_path):
    import importlib.util

    from popxl_launch import cli

    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "python"))   # no mpiexec beside
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r'^mpiexec is not installed \(the mpi extra: '
                                                r'pip install -e "\.\[mpi\]" in the popxl-dist '
                                                r'clone\)$'):
        cli.find_mpiexec()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mpi4py" else real(name, *a))
    assert cli.missing_backend("mpi") == ('mpi4py and mpiexec are not installed (the mpi '
                                          'extra: pip install -e ".[mpi]" in the popxl-dist '
                                          'clone)')
    assert cli.missing_backend("local") is None


def test_a_job_with_more_workers_than_cpus_starts_with_a_note(tmp_path, capsys, monkeypatch):
    """The YAML job follows the launchers' rule (tests/launch/test_console_scripts.py): more
    worker processes than usable CPUs are accepted, with a note."""
    from popxl_launch import cli

    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "mnist.yaml")
    started = []
    monkeypatch.setattr(cli, "usable_cpus", lambda: 1)
    monkeypatch.setattr(cli, "missing_backend", lambda backend: None)
    monkeypatch.setattr(cli, "_run_mpi", lambda *a: started.append(a) or 0)
    assert main(["--backend", "mpi", "--workers", "4", config, "--set", "train.replicas=4",
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert started and started[0][0] == 4
    assert capsys.readouterr().err == ("popxl-run: note: 4 MPI ranks on 1 usable CPU share "
                                       "the cores (slower; the results are the same)\n")
