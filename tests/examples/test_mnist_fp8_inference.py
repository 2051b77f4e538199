"""examples/mnist_fp8_inference.py, shortened: float8 inference matches the NumPy reference of
the same float8 computation and keeps the float32 accuracy."""
import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load():
    sys.path.insert(0, str(EXAMPLES))          # the example imports mnist_popxl
    try:
        spec = importlib.util.spec_from_file_location("mnist_fp8_inference",
                                                      EXAMPLES / "mnist_fp8_inference.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(EXAMPLES))


def test_fp8_inference_matches_numpy_reference(capsys):
    res = _load().main(["--train-steps", "200", "--test-batches", "6", "--no-progress"])
    out = capsys.readouterr().out
    assert "Accuracy on test set, float8:" in out
    assert res["images"] == 600
    # the same computation: identical predictions, logits equal up to float16 rounding
    assert res["agreement"] == 100.0 and res["max_logit_diff"] <= 1e-2, res
    # float8 weights and activations cost little accuracy (chance is 10%)
    assert res["accuracy"] > 60.0 and abs(res["accuracy"] - res["accuracy_float32"]) < 3.0, res


def test_fp8_inference_amax_weight_scales():
    mod = _load()
    weights = mod.train(batch_size=8, epochs=1, lr=0.05, max_steps=50, progress=False)
    res = mod.evaluate(weights, batch_size=50, max_batches=2, metric="amax")
    for name, (codes, scale) in mod.fp8_weights(weights, "amax").items():
        assert res["weight_scales"][name] == scale
        assert abs(weights[name]).max() * 2.0 ** scale <= 240.0 < \
            abs(weights[name]).max() * 2.0 ** (scale + 1)
    assert res["agreement"] == 100.0
