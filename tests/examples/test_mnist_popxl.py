"""The user guide's plain-popxl MNIST program, shortened: it learns."""
import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_popxl.py"


def _load():
    spec = importlib.util.spec_from_file_location("mnist_popxl", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mnist_popxl_trains_and_tests():
    mod = _load()
    weights = mod.train(batch_size=8, epochs=1, lr=0.05, max_steps=250, progress=False)
    acc = mod.test(weights, batch_size=80, max_batches=10, progress=False)
    # 250 SGD steps of batch 8 (2,000 images): chance is 10%; this network reaches ~80%.
    assert acc > 65.0, acc
