"""examples/mnist_data_parallel.py: it learns, its replicas stay identical, and one optimiser
step equals a NumPy reference (forward/backward of the MLP, mean over replicas and accumulation
steps, one Adam step). `run_under` runs the example under `popxl-run` for backend tests."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from popxl_launch.data import load_mnist

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mnist_data_parallel.py"
LAYERS = ("fc1", "fc2", "fc3", "fc4")


def _load():
    spec = importlib.util.spec_from_file_location("mnist_data_parallel", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_under(backend: str, workers: int, tmp_path: Path, *args: str,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the example with `popxl-run --backend <backend> --workers <workers>` from `tmp_path`
    (pass e.g. "--save-weights", str(tmp_path / "w.npz") to compare backends bitwise)."""
    cmd = [sys.executable, "-m", "popxl_launch", "--backend", backend, "--workers",
           str(workers), str(EXAMPLE), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          check=False)


# --- NumPy reference ---------------------------------------------------------------------------
_C = np.sqrt(2.0 / np.pi)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_C * (x + 0.044715 * x ** 3)))


def _gelu_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_C * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * x ** 2)


def _mlp_loss_and_grads(w: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
                        ) -> tuple[float, dict[str, np.ndarray]]:
    """Mean softmax cross-entropy of the 4-layer GELU MLP on one micro batch, and its
    gradients (float64)."""
    h, pre = x, []
    for i, name in enumerate(LAYERS):
        z = h @ w[f"{name}.weight"] + w[f"{name}.bias"]
        pre.append((h, z))
        h = _gelu(z) if i < len(LAYERS) - 1 else z
    logits = h - h.max(axis=-1, keepdims=True)
    p = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    n = x.shape[0]
    loss = float(-np.mean(np.log(p[np.arange(n), y])))
    dz = p.copy()
    dz[np.arange(n), y] -= 1.0
    dz /= n
    grads = {}
    for i in reversed(range(len(LAYERS))):
        h_in, z = pre[i]
        if i < len(LAYERS) - 1:
            dz = dz * _gelu_grad(z)
        grads[f"{LAYERS[i]}.weight"] = h_in.T @ dz
        grads[f"{LAYERS[i]}.bias"] = dz.sum(axis=0)
        dz = dz @ w[f"{LAYERS[i]}.weight"].T
    return loss, grads


def _reference_step(w0: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, lr: float,
                    beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-5
                    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """x: (A, R, mb, 784), y: (A, R, mb). Returns (losses (A, R), the gradient averaged over
    accumulation steps and replicas, the weights after one Adam step)."""
    w = {k: v.astype(np.float64) for k, v in w0.items()}
    a_steps, replicas = x.shape[:2]
    losses = np.zeros((a_steps, replicas))
    mean_grad = {k: np.zeros_like(v) for k, v in w.items()}
    for a in range(a_steps):
        for r in range(replicas):
            losses[a, r], g = _mlp_loss_and_grads(w, x[a, r].astype(np.float64), y[a, r])
            for k in mean_grad:
                mean_grad[k] += g[k] / (a_steps * replicas)
    new = {}
    for k, g in mean_grad.items():
        m_hat = (1 - beta1) * g / (1 - beta1)          # bias-corrected first step
        v_hat = (1 - beta2) * g * g / (1 - beta2)
        new[k] = w[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return losses, mean_grad, new


# --- tests -------------------------------------------------------------------------------------
def _replica_weights(program) -> dict[str, np.ndarray]:
    """{name: (replicas, *shape)} read with retrieval_mode "all_replicas"."""
    data = program.session.get_tensors_data(program.variables.tensors)
    return {t.name: np.array(a, copy=True) for t, a in data.items()}


def test_one_step_matches_numpy_reference():
    mod = _load()
    replicas, accumulation, micro_batch, lr = 2, 4, 8, 1e-3
    program = mod.build_train_program(replicas, accumulation, micro_batch, lr,
                                      retrieval_mode="all_replicas")
    images, labels = load_mnist("train")
    n = accumulation * replicas * micro_batch
    x = ((images[:n].astype(np.float32) / 255.0 - 0.1307) / 0.3081).reshape(
        accumulation, replicas, micro_batch, 28 * 28)
    y = labels[:n].reshape(accumulation, replicas, micro_batch)
    with program.session:
        before = _replica_weights(program)   # attached: read back from the replicas
        out = program.session.run(dict(zip(program.input_streams, [x, y])))
    assert set(before) == {f"{layer}.{p}" for layer in LAYERS for p in ("weight", "bias")}
    for k, v in before.items():
        assert v.shape[0] == replicas and np.array_equal(v[0], v[1]), k
    w0 = {k: v[0] for k, v in before.items()}
    after = _replica_weights(program)

    state = program.session.get_tensors_data(program.optimiser_state.tensors)
    state = {k: state[t] for k, t in program.optimiser_state.named_tensors.items()}

    ref_losses, ref_grad, ref = _reference_step(w0, x, y, lr)
    np.testing.assert_allclose(out[program.loss_stream], ref_losses, rtol=1e-5, atol=1e-6)
    # Adam's moments after one step hold the all-reduced mean gradient itself (Adam's update
    # alone is nearly sign(g) on a first step, so it would hide a wrongly scaled gradient).
    for k, g in ref_grad.items():
        np.testing.assert_allclose(state[f"{k}.first_order"], 0.1 * g, rtol=1e-4, atol=1e-8,
                                   err_msg=k)
        np.testing.assert_allclose(state[f"{k}.second_order"], 0.001 * g * g, rtol=1e-4,
                                   atol=1e-12, err_msg=k)
        assert float(state[f"{k}.step"]) == 1.0
    for k, v in after.items():
        assert np.array_equal(v[0], v[1]), f"replicas differ for {k}"
        np.testing.assert_allclose(v[0], ref[k], rtol=0, atol=1e-5, err_msg=k)
        # The step moved every tensor (a missing all-reduce or optimiser would not match ref).
        assert not np.array_equal(v[0], w0[k]), k


def test_short_run_learns_and_replicas_stay_identical():
    mod = _load()
    program = mod.build_train_program(2, 4, 8, 1e-3, retrieval_mode="all_replicas")
    losses = mod.train(program, epochs=1, limit=20, progress=False, verbose=False)
    assert len(losses) == 20 and np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses

    per_replica = _replica_weights(program)
    for k, v in per_replica.items():
        assert v.shape[0] == 2 and np.array_equal(v[0], v[1]), f"replicas differ for {k}"
    acc = mod.test({k: v[0] for k, v in per_replica.items()}, batch_size=80, max_batches=10,
                   progress=False)
    # 20 Adam steps of 64 images; chance is 10%, this reaches ~75-80%.
    assert acc > 60.0, acc


def test_main_cli_and_run_under_local(tmp_path, capsys):
    """`main` in-process and the same command under `popxl-run --backend local` give the same
    printed accuracy and bitwise the same saved weights."""
    mod = _load()
    args: list[str] = ["--limit", "3", "--test-batches", "3", "--no-progress"]
    assert mod.main(args + ["--save-weights", str(tmp_path / "inproc.npz")]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"Accuracy on test set: (\d+\.\d\d)%", printed)
    assert m, printed

    res = run_under("local", 1, tmp_path, *args, "--save-weights", str(tmp_path / "sub.npz"))
    assert res.returncode == 0, res.stderr
    assert f"Accuracy on test set: {m.group(1)}%" in res.stdout, res.stdout
    a, b = np.load(tmp_path / "inproc.npz"), np.load(tmp_path / "sub.npz")
    assert sorted(a.files) == sorted(b.files) == sorted(
        f"{layer}.{p}" for layer in LAYERS for p in ("weight", "bias"))
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
