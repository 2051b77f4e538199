"""The transformer benchmark's popxl model computes the GPT it describes: its first loss is that
of a NumPy forward pass written here, on the same weights and data, and it trains. (The PyTorch
twin is compared by the benchmark itself; tests do not import torch.)"""
import math
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_transformer as bench  # noqa: E402

CFG = dict(hidden=16, layers=2, heads=2, seq=8, vocab=32, batch=2)


def _ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def numpy_loss(cfg, w, tokens, labels):
    B, S, H, NH, V = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    hd = H // NH
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = (w["embedding.weight"][tokens].reshape(B, S, H) + w["positions"]).reshape(B * S, H)
    mask = np.tril(np.ones((S, S), bool))
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        h = _ln(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attention.qkv.weight"] + w[p + "attention.qkv.bias"]
        q, k, v = (t.reshape(B, S, NH, hd).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.where(mask, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        z = (a @ v).transpose(0, 2, 1, 3).reshape(B * S, H)
        x = x + z @ w[p + "attention.output.weight"] + w[p + "attention.output.bias"]
        h = _ln(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        h = _gelu(h @ w[p + "mlp.fc_1.weight"] + w[p + "mlp.fc_1.bias"])
        x = x + h @ w[p + "mlp.fc_2.weight"] + w[p + "mlp.fc_2.bias"]
    logits = _ln(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["head.weight"]
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -logp[np.arange(B * S), labels].mean()


def test_popxl_gpt_step_matches_numpy_forward():
    rec = bench.run_popxl(types.SimpleNamespace(dtype="float32", replicas=1, steps=2), dict(CFG))
    tokens, labels = bench.make_data(CFG)[0]
    want = numpy_loss(CFG, bench.init_weights(CFG), tokens[0], labels[0])
    assert abs(rec["losses"][0] - want) < 1e-5 * want
    assert rec["cpu_step_ms"] > 0 and rec["peak_rss_mb"] > 0 and rec["compile_s"] > 0


def test_popxl_gpt_trains():
    import popxl

    ir, (tok_s, lab_s, loss_s), variables = bench.popxl_model(CFG, "float32")
    weights = bench.init_weights(CFG)
    tokens, labels = bench.make_data(CFG)[0]
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.write_variables_data({variables[n]: weights[n] for n in weights})
        losses = [float(sess.run({tok_s: tokens[0], lab_s: labels[0]})[loss_s])
                  for _ in range(8)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses     # Adam on one batch


def test_gpt_losses_do_not_depend_on_the_thread_count(monkeypatch):
    """The benchmark's GPT at a size whose products and element-wise work split into blocks:
    bitwise the same losses with POPXL_THREADS 1, 2, 4 and the default, float32 and float16."""
    from thread_counts import assert_same_bits_and_parallel, over_thread_counts

    cfg = dict(hidden=128, layers=1, heads=4, seq=64, vocab=512, batch=8)
    for dtype in ("float32", "float16"):
        args = types.SimpleNamespace(dtype=dtype, replicas=1, steps=2)
        results = over_thread_counts(monkeypatch, lambda: bench.run_popxl(args, dict(cfg))["losses"])
        assert_same_bits_and_parallel(results)


def test_f16_pair_times_both_programs_step_by_step():
    rec = bench.run_f16_pair(types.SimpleNamespace(steps=4), dict(CFG))
    assert rec["pairs"] == 4
    assert rec["f32_step_ms"] > 0 and rec["f16_step_ms"] > 0
    assert rec["q1"] <= rec["ratio"] <= rec["q3"]
