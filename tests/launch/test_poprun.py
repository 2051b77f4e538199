"""`poprun` and `popxl-run --instances`: options, the topology table, Open MPI argument
translation, output prefixes and filtering, the popdist environment of each instance, exit
codes. Two cheap MPI launches; the multi-instance programs are in
tests/popxl_dist/runtime/test_instances.py."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from popxl_launch.cli import main as popxl_run_main
from popxl_launch.instances import InstanceLaunch, topology_table, translate_mpi_args
from popxl_launch.output import LinePrefixer
from popxl_launch.poprun import main as poprun_main

BIN = os.path.dirname(sys.executable)
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or not os.path.exists(os.path.join(BIN, "mpiexec")),
    reason="mpi4py / mpich not installed")

TABLE_2x4 = """\
 ===========================
|      poprun topology      |
|===========================|
| hosts     |   localhost   |
|-----------|---------------|
| ILDs      |       0       |
|-----------|---------------|
| instances |   0   |   1   |
|-----------|---------------|
| replicas  | 0 | 1 | 2 | 3 |
 ---------------------------"""


def test_topology_table():
    assert topology_table(InstanceLaunch(2, 4)) == TABLE_2x4
    table = topology_table(InstanceLaunch(4, 12, hosts=["a", "b"]))
    lines = table.splitlines()
    assert len({len(line) for line in lines if line.startswith("|")}) == 1   # aligned rows
    assert lines[3].split("|")[2:4] == ["a".center(29), "b".center(29)]   # 6 cells of 4
    assert "| 10 | 11 |" in lines[9]
    for n, r in ((1, 1), (2, 2), (1, 3)):  # cells too narrow for "localhost" or the title
        lines = topology_table(InstanceLaunch(n, r)).splitlines()
        assert len({len(line) for line in lines if line.startswith("|")}) == 1, \
            "\n".join(lines)
        assert " localhost " in lines[3]
        assert lines[1].strip("| ") == "poprun topology"


def test_open_mpi_arguments_become_hydra_arguments():
    out, notes = translate_mpi_args(["--tag-output", "-x", "A=1", "-x", "PATH", "--bind-to",
                                     "none", "--mca=btl_tcp_if_include eth0", "-verbose"],
                                    local=False)
    assert out == ["-genv", "A", "1", "-bind-to", "none", "-verbose"]
    assert any("--tag-output" in n for n in notes) and any("--mca" in n for n in notes)
    assert translate_mpi_args(["-x", "B=2"], local=True)[0] == ["-env", "B", "2"]


def test_impossible_launches_are_refused(capsys):
    cases = [(["--num-instances", "3", "--num-replicas", "4", "true"], "not divisible"),
             (["--num-instances", "0", "true"], "--num-instances must be >= 1"),
             (["--num-instances", "2", "--only-output-from-instance", "2", "true"],
              "not an instance of 0..1"),
             (["--num-instances", "2", "--instance-mpi-local-args", "x:-x A=1", "true"],
              "INSTANCE:ARGS"),
             (["--num-instances", "2", "--instance-mpi-local-args", "5:-x A=1", "true"],
              "outside 0..1"),
             (["--num-instances", "3", "-H", "a,b", "true"], "not divisible by the 2 hosts"),
             (["--num-instances", "2"], "no command given")]
    for argv, message in cases:
        assert poprun_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_popxl_run_instances_refuses_impossible_launches(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("POPXL_BACKEND", raising=False)
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    cases = [(["--instances", "2", str(script)], "needs --backend mpi or ray"),
             (["--backend", "mpi", "--instances", "2", "--workers", "2", str(script)],
              "--workers does not apply"),
             (["--backend", "mpi", "--instances", "3", "--replicas", "4", str(script)],
              "not divisible"),
             (["--backend", "ray", "--instances", "0", str(script)], ">= 1"),
             (["--backend", "mpi", "--instances", "2", str(tmp_path / "none.py")],
              "no such script")]
    for argv, message in cases:
        assert popxl_run_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_line_prefixer_holds_partial_lines():
    p = LinePrefixer("[1,0]<stdout>: ")
    assert p.feed(b"ab") == b""
    assert p.feed(b"c\nde\n\nf") == b"[1,0]<stdout>: abc\n[1,0]<stdout>: de\n[1,0]<stdout>: \n"
    assert p.flush() == b"[1,0]<stdout>: f\n" and p.flush() == b""


SHOW_ENV = """
import os, sys
keys = ["POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET",
        "POPDIST_LOCAL_INSTANCE_INDEX", "POPDIST_NUM_IPUS_PER_REPLICA", "A", "B"]
import popdist
print(popdist.getInstanceIndex(), popdist.getNumInstances(), popdist.getNumLocalReplicas(),
      popdist.getReplicaIndexOffset(), [os.environ.get(k) for k in keys], flush=True)
print("err", popdist.getInstanceIndex(), file=sys.stderr, flush=True)
sys.exit(3 if popdist.getInstanceIndex() == 1 else 0)
"""


def _run(cmd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPXL_", "POPDIST_"))}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@needs_mpi
def test_poprun_environment_prefixes_filters_and_exit_code(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW_ENV)
    res = _run([sys.executable, "-m", "popxl_launch.poprun", "--num-instances", "2",
                "--num-replicas", "4", "--ipus-per-replica", "2", "--print-topology", "yes",
                "-H", "localhost",
                "--only-output-from-instance", "1", "--vipu-partition", "p0",
                "--reset-partition", "no", "--mpi-global-args=--tag-output -x A=1",
                "--instance-mpi-local-args=1:-x B=2", sys.executable, str(script)])
    assert res.returncode == 3, res.stdout + res.stderr         # instance 1's exit code
    assert res.stdout.startswith(TABLE_2x4 + "\n")
    assert "poprun: ignoring --vipu-partition" in res.stderr
    assert "poprun: ignoring --reset-partition" in res.stderr
    assert "ignoring Open MPI option --tag-output" in res.stderr
    assert "[1,0]<stdout>:" not in res.stdout                    # filtered out
    want = "[1,1]<stdout>: 1 2 2 2 ['4', '2', '2', '1', '2', '1', '2']"
    assert want in res.stdout.splitlines(), res.stdout
    assert "[1,0]<stderr>: err 0" in res.stderr and "[1,1]<stderr>: err 1" in res.stderr


@needs_mpi
def test_popxl_run_mpi_instances_prefix_and_environment(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW_ENV.replace("sys.exit(3 if popdist.getInstanceIndex() == 1 else 0)",
                                       ""))
    res = _run([sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--instances", "2",
                str(script)])
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert "[instance 0] 0 2 1 0 ['2', '1', '0', '0', '1', None, None]" in lines, lines
    assert "[instance 1] 1 2 1 1 ['2', '1', '1', '1', '1', None, None]" in lines, lines
