"""`popxl-inspect`: a script's Irs built up to its first device operation, the memory report
per replica and process (with the warning when the launch cannot fit), every graph as a
Graphviz file (ops with their type and source line, called graphs as clusters), the generated
code of a graph on request, and the built-in job's two programs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from popxl.debug import memory
from popxl_launch import inspector

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """\
import numpy as np
import popxl
import popxl.ops as ops


def build(R):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((4, 16), popxl.float32, "x")
        w = popxl.variable(np.ones((16, 16), np.float32), name="w")
        x = ops.host_load(xs, "x")

        def layer(t, w):
            return ops.gelu(t @ w)

        g = ir.create_graph(layer, x, w)
        y, = ops.call(g, x, w)
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    return ir, xs


train, xs = build(2)
test, _ = build(1)
a = popxl.Session(train, "ipu_hw")
b = popxl.Session(test, "ipu_hw")
with a:
    a.run({xs: np.ones((2, 4, 16), np.float32)})
raise SystemExit("ran past the first device operation")
"""


@pytest.fixture
def script(tmp_path, monkeypatch):
    for var in ("POPXL_BACKEND", "POPXL_WORKERS"):
        monkeypatch.setenv(var, "")          # restored afterwards: main() sets them
    path = tmp_path / "two_programs.py"
    path.write_text(SCRIPT)
    return path


def test_report_graphs_and_code(script, tmp_path, capsys):
    out = tmp_path / "views"
    assert inspector.main(["--backend", "mpi", "--workers", "2", "--no-base", "--out", str(out),
                           "--code", "main", "--code", "build.layer_subgraph(0)", str(script)]) == 0
    text = capsys.readouterr().out
    assert "2 Ir(s) built before the first device operation" in text
    assert "Ir 1 (session" in text and "Ir 2 (session" in text
    assert "2 replica(s) on 2 worker(s) [(0, 1), (1, 2)]" in text
    assert re.search(r"variables \(device state\) +1\.0 KiB", text)     # 16 x 16 float32
    assert "host (the script, worker 0)" in text and "  worker 1: " in text
    assert "this machine:" in text and "WARNING" not in text
    dots = sorted(p.name for p in out.glob("*.dot"))
    assert dots == ["ir1-build.layer_subgraph_0_.dot", "ir1-main.dot",
                    "ir2-build.layer_subgraph_0_.dot", "ir2-main.dot"]
    main = (out / "ir1-main.dot").read_text()
    assert main.startswith("digraph popxl {") and main.rstrip().endswith("}")
    assert main.count("{") == main.count("}")
    for label in ("HostLoad\\nhost_load\\ntwo_programs.py:11", "Call\\n",
                  "MatMul\\nmatmul\\ntwo_programs.py:14", "Gelu\\ngelu\\ntwo_programs.py:14"):
        assert label in main, label
    assert 'subgraph "cluster_build.layer_subgraph_0_"' in main and "lhead=" in main
    code = (out / "ir1-main.py").read_text()
    assert code.startswith("def run(ctx") and "# generated code of graph main" in text
    assert (out / "ir1-build.layer_subgraph_0_.py").read_text() in text
    if shutil.which("dot"):
        assert (out / "ir1-main.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    else:
        assert "no .svg: Graphviz's `dot` is not installed" in text


def test_warns_when_the_launch_cannot_fit(script, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda: 4096)
    assert inspector.main(["--no-base", "--no-graphs", str(script)]) == 0
    text = capsys.readouterr().out
    assert "WARNING: this launch needs" in text and "4.0 KiB this machine has available" in text


def test_bad_targets(tmp_path, script, capsys):
    assert inspector.main([str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("import popxl\nir = popxl.Ir()\n")
    assert inspector.main(["--no-base", str(empty)]) == 1
    assert "created no popxl.Session" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no such graph"):
        inspector.main(["--no-base", "--no-graphs", "--code", "nope", str(empty.parent /
                                                                           "two_programs.py")])


def test_the_main_job_config_and_the_console_script(tmp_path):
    """`popxl-inspect configs/mnist.yaml` (a subprocess, as a user runs it) finds the job's
    training and test programs; the base of a worker is measured."""
    exe = os.path.join(os.path.dirname(sys.executable), "popxl-inspect")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPXL_", "POPDIST_"))}
    res = subprocess.run([exe, "--no-graphs", str(ROOT / "configs" / "mnist.yaml")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 Ir(s) built before the first device operation" in res.stdout
    base = re.search(r"engine after a first run ([\d.]+) (\w+)", res.stdout)
    assert base and float(base.group(1)) > 0
    assert not list(tmp_path.iterdir())          # nothing written (no run folder, no graphs)
