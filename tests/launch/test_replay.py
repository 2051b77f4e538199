"""`popxl-replay`: a recorded failure replays with the same error (exit 1), a good run with
its outputs bitwise (exit 0); `--replica`; bad bundles get one clear line (exit 2); the console
script exists."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import NonFiniteError
from popxl_launch.replay import main


@pytest.fixture
def bundles(tmp_path, monkeypatch):
    """A good run's bundle and a failing run's, recorded with 2 replicas on 2 worker threads."""
    monkeypatch.setenv("POPXL_RECORD", str(tmp_path / "rec"))
    monkeypatch.setenv("POPXL_DEBUG_NANS", "1")
    monkeypatch.setenv("POPXL_WORKERS", "2")
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        y = ops.log(ops.host_load(xs, "x")) * w
        ops.var_updates.accumulate_(w, ops.collectives.replicated_all_reduce(y, op="mean"))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({xs: np.full((2, 3), 2, np.float32)})
        good_out = sess.run({xs: np.full((2, 3), 3, np.float32)})[ys]
        good = popxl.debug.save_replay(sess)[0]
        with pytest.raises(NonFiniteError) as info:
            sess.run({xs: np.array([[1, 2, 3], [1, -2, 3]], np.float32)})
    return good, good_out, info.value.replay_bundle, info.value


def test_replays(bundles, capsys):
    good, good_out, failed, err = bundles
    # (Sessions are numbered per process: earlier tests of the suite made some)
    assert re.fullmatch(r"session\d+-run2", os.path.basename(good))
    assert os.path.basename(failed).endswith("3")
    assert main([good]) == 0
    out = capsys.readouterr().out
    assert "outputs identical to the recorded run's (bitwise)" in out, out
    assert main([good, "--replica", "1"]) == 0
    assert "y replica 1" in capsys.readouterr().out
    assert main([failed]) == 1
    captured = capsys.readouterr()
    assert "the same error as the recorded run" in captured.out, captured
    assert str(err).splitlines()[0] in captured.err
    result = popxl.debug.replay(good)
    assert result.identical and np.array_equal(result.outputs["y"][0], good_out)


def test_a_bundle_whose_run_differs_is_reported(bundles, capsys):
    good, _, _, _ = bundles
    part = os.path.join(good, "part-r1-2.npz")
    with np.load(part) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["out0"] = arrays["out0"] + 1          # a recording the replay cannot match
    np.savez(part, **arrays)
    assert main([good]) == 3
    assert "DIFFERENT" in capsys.readouterr().out


def test_bad_bundles(tmp_path, bundles, capsys):
    good, _, _, _ = bundles
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "is not a replay bundle" in capsys.readouterr().err
    half = tmp_path / "half"
    shutil.copytree(good, half)
    os.remove(half / "part-r1-2.json")
    assert main([str(half)]) == 2
    assert "lacks the parts of replicas [1]" in capsys.readouterr().err
    assert main([good, "--replica", "5"]) == 2


def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "popxl-replay")
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--pdb" in res.stdout
