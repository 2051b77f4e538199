"""examples/mnist_rts.py: the replica-sharded program trains to bitwise the same weights as the
unsharded one (and as the data-parallel example), its sharded part takes 1/R of the device
memory, it learns, and it runs the same under `popxl-run` (local, and mpi when installed)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mnist_rts.py"
DP_EXAMPLE = ROOT / "examples" / "mnist_data_parallel.py"
LAYERS = ("fc1", "fc2", "fc3", "fc4")
WEIGHTS = tuple(f"{layer}.weight" for layer in LAYERS)

HAVE_MPI = (importlib.util.find_spec("mpi4py") is not None
            and os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rts():
    return _load(EXAMPLE, "mnist_rts_under_test")


@pytest.fixture(autouse=True)
def local_backend(monkeypatch):
    monkeypatch.setenv("POPXL_BACKEND", "local")
    monkeypatch.delenv("POPXL_WORKERS", raising=False)


def run_under(backend: str, workers: int, tmp_path: Path, *args: str,
              timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    cmd = [sys.executable, "-m", "popxl_launch", "--backend", backend, "--workers",
           str(workers), str(EXAMPLE), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


def _op_types(program) -> Counter:
    ir = program.session.ir
    return Counter(op.opType() for g in ir._pb_ir.getAllGraphs() for op in g.getOps())


def _state(program) -> dict[str, np.ndarray]:
    data = program.session.get_tensors_data(program.optimiser_state.tensors)
    return {k: data[t] for k, t in program.optimiser_state.named_tensors.items()}


def test_sharded_and_unsharded_weights_bitwise_equal(rts):
    sharded = rts.build_train_program(4, rts=True)
    whole = rts.build_train_program(4, rts=False)
    assert sharded.sharded and not whole.sharded
    assert sharded.rts_keys == whole.rts_keys == WEIGHTS        # threshold 1024: not biases
    ops_s, ops_w = _op_types(sharded), _op_types(whole)
    # Sharded weights: gathered before the forward pass, gradients reduce-scattered.
    assert ops_s["ReplicatedAllGather"] == 4 and ops_s["ReplicatedReduceScatter"] == 4
    assert ops_s["ReplicatedAllReduceInplace"] == 4                # the biases
    assert ops_w["ReplicatedAllReduceInplace"] == 8 and not ops_w["ReplicatedReduceScatter"]
    # Adam moments in remote buffers in both, and the weight shards in the sharded one.
    assert ops_w["RemoteLoad"] == ops_w["RemoteStore"] == 16
    assert ops_s["RemoteLoad"] == ops_s["RemoteStore"] == 20

    dp = _load(DP_EXAMPLE, "mnist_dp_for_rts_test")
    reference = dp.build_train_program(4)
    for prog in (sharded, whole, reference):
        losses = rts.dp.train(prog, limit=5, progress=False, verbose=False)
        assert len(losses) == 5
    w_s, w_w, w_ref = (rts.dp.trained_weights(p) for p in (sharded, whole, reference))
    assert sorted(w_s) == sorted(w_w) == sorted(f"{layer}.{p}" for layer in LAYERS
                                                for p in ("weight", "bias"))
    for k in w_s:
        assert w_s[k].shape == w_w[k].shape
        assert w_s[k].tobytes() == w_w[k].tobytes(), f"{k}: sharded != unsharded"
        assert w_w[k].tobytes() == w_ref[k].tobytes(), f"{k}: differs from the DP example"
    st_s, st_w = _state(sharded), _state(whole)
    assert sorted(st_s) == sorted(st_w) == sorted(_state(reference))
    for k in st_s:
        assert st_s[k].tobytes() == st_w[k].tobytes(), f"Adam state {k} differs"
    assert float(st_s["fc1.weight.step"]) == 5.0


@pytest.mark.parametrize("replicas", [2, 4])
def test_memory_report_cut_by_replica_count(rts, replicas):
    programs = {"no RTS": rts.build_train_program(replicas, rts=False),
                "RTS": rts.build_train_program(replicas, rts=True)}
    reports = {}
    for label, prog in programs.items():
        with prog.session:
            reports[label] = prog.session.device_memory_report()
        assert len(reports[label]) == 1
    whole, shard = reports["no RTS"][0], reports["RTS"][0]
    # 784*512 + 2*512*512 + 512*10 float32 weights, each with two float32 Adam moments.
    candidates = 3 * 4 * (784 * 512 + 2 * 512 * 512 + 512 * 10)
    assert programs["no RTS"].candidate_bytes() == candidates
    rest = programs["RTS"].other_bytes()
    assert rest == programs["no RTS"].other_bytes()

    def total(r):
        return r["variables"] + r["rts_shards"] + r["remote_buffers"]

    assert total(whole) - rest == candidates
    assert total(shard) - rest == candidates // replicas
    assert (total(whole) - rest) / (total(shard) - rest) == replicas
    # The whole weights leave the chip; the accumulators and biases stay.
    assert whole["variables"] - shard["variables"] == candidates // 3

    with programs["no RTS"].session, programs["RTS"].session:
        table = rts.memory_table(programs)
    line = next(ln for ln in table.splitlines() if ln.startswith("sharded part"))
    assert f"{candidates:,}" in line and f"{candidates // replicas:,}" in line
    assert line.rstrip().endswith(f"{float(replicas):.2f}x"), table


def test_short_run_learns(rts):
    program = rts.build_train_program(4, rts=True)
    losses = rts.dp.train(program, epochs=1, limit=15, progress=False, verbose=False)
    assert len(losses) == 15 and np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses
    acc = rts.dp.test(rts.dp.trained_weights(program), batch_size=80, max_batches=10,
                      progress=False)
    # 15 Adam steps of 128 images; chance is 10%, this reaches ~74%.
    assert acc > 60.0, acc


def _accuracy(text: str) -> str:
    m = re.search(r"Accuracy on test set: (\d+\.\d\d)%", text)
    assert m, text
    return m.group(1)


def _assert_same_weights(a_path: Path, b_path: Path) -> None:
    a, b = np.load(a_path), np.load(b_path)
    assert sorted(a.files) == sorted(b.files) == sorted(
        f"{layer}.{p}" for layer in LAYERS for p in ("weight", "bias"))
    for k in a.files:
        assert a[k].tobytes() == b[k].tobytes(), k


ARGS = ["--limit", "3", "--test-batches", "3", "--no-progress"]


def test_main_cli_rts_no_rts_and_run_under_local(rts, tmp_path, capsys):
    assert rts.main(ARGS + ["--memory-report", "--save-weights", str(tmp_path / "rts.npz")]) == 0
    out = capsys.readouterr().out
    assert "Replica-sharded over 4 replicas: fc1.weight, fc2.weight, fc3.weight, fc4.weight" \
        in out
    assert re.search(r"sharded part\s+2,792,448", out), out
    acc = _accuracy(out)

    assert rts.main(ARGS + ["--no-rts", "--save-weights", str(tmp_path / "whole.npz")]) == 0
    out = capsys.readouterr().out
    assert "Nothing sharded" in out and _accuracy(out) == acc
    _assert_same_weights(tmp_path / "rts.npz", tmp_path / "whole.npz")

    res = run_under("local", 1, tmp_path, *ARGS, "--save-weights", str(tmp_path / "sub.npz"))
    assert res.returncode == 0, res.stderr
    assert _accuracy(res.stdout) == acc
    _assert_same_weights(tmp_path / "rts.npz", tmp_path / "sub.npz")


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
def test_run_under_mpi_two_workers(rts, tmp_path, capsys):
    """2 MPI workers x 2 replicas each: the same weights, bit for bit, as in one process."""
    assert rts.main(ARGS + ["--save-weights", str(tmp_path / "local.npz")]) == 0
    acc = _accuracy(capsys.readouterr().out)
    res = run_under("mpi", 2, tmp_path, *ARGS, "--memory-report",
                    "--save-weights", str(tmp_path / "mpi.npz"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert _accuracy(res.stdout) == acc
    assert re.search(r"sharded part\s+2,792,448", res.stdout), res.stdout
    _assert_same_weights(tmp_path / "local.npz", tmp_path / "mpi.npz")
