"""examples/gpt_tiny_tp.py (shortened): the tensor-parallel runs give the losses of TP=1, the
first loss equals a NumPy transformer written here, and training lowers the loss. The same run
under MPI (bit for bit equal to local) is part of tests/popxl_dist/runtime/test_backends.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt_tiny_tp.py"


@pytest.fixture(scope="module")
def gpt():
    spec = importlib.util.spec_from_file_location("gpt_tiny_tp", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpt_tiny_tp"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("tp,dp", [(2, 2), (4, 1)])
def test_tensor_parallel_losses_equal_tp1(gpt, tmp_path, capsys, tp, dp):
    path = tmp_path / "losses.npy"
    assert gpt.main(["--tp", str(tp), "--dp", str(dp), "--steps", "3", "--compare",
                     "--save-losses", str(path)]) == 0
    losses, ref = np.load(path)
    np.testing.assert_allclose(losses, ref, rtol=gpt.COMPARE_RTOL)
    assert ref[-1] < ref[0] - 0.05                       # it learns
    assert f"TP={tp} vs TP=1 losses" in capsys.readouterr().out


# --- NumPy reference of the first step's loss ------------------------------------------------
def _ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _rope(t, rotary_dim):
    """RoPE on (batch, heads, seq, head): features (2i, 2i + 1) are the real and imaginary
    parts of a complex number turned by the angle p / 10000^(2i/r) of position p."""
    seq, half = t.shape[2], rotary_dim // 2
    ang = np.arange(seq)[:, None] / 10000 ** (2 * np.arange(half)[None, :] / rotary_dim)
    z = (t[..., 0:rotary_dim:2] + 1j * t[..., 1:rotary_dim:2]) * np.exp(1j * ang)
    out = t.copy()
    out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2] = z.real, z.imag
    return out


def _loss(cfg, w, ids, labels):
    B, S, H, nh, hd = ids.shape[0], cfg.seq, cfg.hidden, cfg.heads, cfg.head_size
    x = w["embedding.weight"][ids.reshape(-1)]
    mask = np.triu(np.full((S, S), -1e4), k=1)
    for i in range(cfg.layers):
        p = f"layers.{i}."
        h = _ln(x, w[p + "ln1.weight"], w[p + "ln1.bias"])
        a = p + "attention."
        q, k, v = ((h @ w[a + n + ".weight"] + w[a + n + ".bias"]).reshape(B, S, nh, hd)
                   .transpose(0, 2, 1, 3) for n in "qkv")
        q, k = _rope(q, cfg.rotary_dim), _rope(k, cfg.rotary_dim)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ctx = (pr @ v).transpose(0, 2, 1, 3).reshape(B * S, H)
        x = x + ctx @ w[a + "out.weight"] + w[a + "bias"]
        h = _ln(x, w[p + "ln2.weight"], w[p + "ln2.bias"])
        m = p + "mlp."
        f = _ln(_gelu(h @ w[m + "fc1.weight"] + w[m + "fc1.bias"]), w[m + "ln.weight"],
                w[m + "ln.bias"])
        x = x + f @ w[m + "fc2.weight"] + w[m + "bias"]
    logits = _ln(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["head.weight"]
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return np.mean(lse - logits[np.arange(B * S), labels.reshape(-1)])


def test_first_loss_equals_numpy_transformer(gpt):
    cfg, dp, seed = gpt.Config(), 2, 0
    program = gpt.build_program(cfg, 1, dp)
    weights = {k: v.astype(np.float64)
               for k, v in gpt.reference_weights(program.variables, 1, seed).items()}
    tokens = next(gpt.token_batches(cfg, dp, 1, seed + 1))
    want = np.mean([_loss(cfg, weights, t[:, :-1], t[:, 1:]) for t in tokens])
    got = gpt.train(cfg, 2, dp, 1, seed, verbose=False)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_bad_sizes_are_refused(gpt, capsys):
    with pytest.raises(ValueError, match="--tp 3 must divide the heads"):
        gpt.build_program(gpt.Config(), 3, 1)
    with pytest.raises(SystemExit):
        gpt.main(["--tp", "0"])
    assert "--tp must be >= 1" in capsys.readouterr().err
