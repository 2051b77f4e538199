"""tools/trace_png.py draws one run of a real profiler trace as a PNG (offline, matplotlib)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import popxl
import popxl.ops as ops

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                reason="needs the plot extra")


def _trace(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("POPXL_PROFILE", str(tmp_path / "prof"))
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        xs = popxl.h2d_stream((4, 8), popxl.float32, "x")
        w = popxl.variable(np.ones((8, 8), np.float32))
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs, "x") @ w)
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    with popxl.Session(ir, "cpu") as s:
        for _ in range(2):
            s.run({xs: np.ones((2, 4, 8), np.float32)})
    return Path(popxl.debug.write_profile())


def test_draws_a_run(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("trace_png", ROOT / "tools" / "trace_png.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    trace = _trace(tmp_path, monkeypatch)
    out = tmp_path / "run.png"
    assert mod.main([str(trace), str(out), "--run", "2"]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(SystemExit, match="no Session.run"):
        mod.draw({"traceEvents": []}, str(tmp_path / "none.png"))
    assert json.loads(trace.read_text())["traceEvents"]
