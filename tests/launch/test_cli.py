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
