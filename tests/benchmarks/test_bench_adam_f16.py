"""The float16-Adam benchmark runs, and its two programs train alike: float16 first-order
state gives the float32 program's weights up to float16 rounding of the moment."""
import os
import sys

import numpy as np

import popxl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_adam_f16 as bench  # noqa: E402


def _weights_after(first_order_dtype, inputs_seed=1, steps=3):
    sess, (img, lab) = bench.train_session(4, first_order_dtype)
    rng = np.random.default_rng(inputs_seed)
    inputs = {img: rng.random((4, 28, 28), np.float32),
              lab: rng.integers(0, 10, 4).astype(np.int32)}
    variables = [v for v in sess.ir.main_graph.variables if v.name.endswith("weight")]
    w0 = {v: d.copy() for v, d in sess.get_tensors_data(variables).items()}   # (views)
    with sess:
        for _ in range(steps):
            sess.run(inputs)
        w = sess.get_tensors_data(variables)
    return {v.name: (w0[v], w[v]) for v in variables}


def test_float16_first_order_trains_like_float32():
    f32 = _weights_after(popxl.float32)
    f16 = _weights_after(popxl.float16)
    assert f32.keys() == f16.keys() and f32
    for name in f32:
        w0, w32 = f32[name]
        _, w16 = f16[name]
        assert np.abs(w32 - w0).max() > 1e-4                 # it trained
        np.testing.assert_allclose(w16, w32, atol=2e-5)      # lr 1e-3, moment rounded to f16
        assert not np.array_equal(w16, w32)                  # ... and float16 was used


def test_benchmark_prints_both_figures(capsys):
    bench.main(["--steps", "1", "--rounds", "1", "--batch-size", "2"])
    out = capsys.readouterr().out
    assert "first_order float32:" in out and "first_order float16:" in out
    assert "float16 / float32 =" in out
