"""The examples give bitwise the same results with POPXL_THREADS 1, 2, 4 and the default: the
plain-popxl MNIST program, the data-parallel one (2 replicas on one worker), the pipelined and
phased programs, the fp8 inference example and the tensor-parallel GPT (4 replicas)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from thread_counts import assert_same_bits_and_parallel, over_thread_counts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_threads", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def local_backend(monkeypatch):
    monkeypatch.setenv("POPXL_BACKEND", "local")
    monkeypatch.delenv("POPXL_WORKERS", raising=False)


def test_mnist_popxl(monkeypatch):
    mod = _load("mnist_popxl")

    def run():
        np.random.seed(42)                 # the example seeds its weights once, at import
        weights = mod.train(batch_size=512, epochs=1, lr=0.05, max_steps=4, progress=False)
        return weights, mod.test(weights, batch_size=1000, max_batches=2, progress=False)

    assert_same_bits_and_parallel(over_thread_counts(monkeypatch, run))


def test_mnist_data_parallel(monkeypatch):
    mod = _load("mnist_data_parallel")

    def run():
        program = mod.build_train_program(2, 4, 8, 1e-3, retrieval_mode="all_replicas")
        losses = mod.train(program, epochs=1, limit=4, progress=False, verbose=False)
        return losses, mod.trained_weights(program)

    # 2 replicas: 2 threads run them at once, 4 also split their ops
    assert_same_bits_and_parallel(over_thread_counts(monkeypatch, run), parallel_in=("4",))


@pytest.mark.parametrize("name,extra", [("mnist_pipelined", []), ("mnist_phased", [])])
def test_pipelined_and_phased(monkeypatch, tmp_path, name, extra):
    mod = _load(name)
    runs = iter(range(10))

    def run():
        path = tmp_path / f"w{next(runs)}.npz"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert mod.main(["--limit", "3", "--test-batches", "2", "--no-progress",
                             "--save-weights", str(path)] + extra) == 0
        data = np.load(path)
        return ({k: data[k] for k in data.files},
                re.findall(r"(mean loss \d+\.\d+|Accuracy on test set: .*%)", out.getvalue()))

    results = over_thread_counts(monkeypatch, run)
    assert_same_bits_and_parallel(results, parallel_in=())


def test_fp8_inference(monkeypatch):
    mod = _load("mnist_fp8_inference")

    def run():
        with contextlib.redirect_stdout(io.StringIO()):
            return mod.main(["--train-steps", "20", "--test-batches", "2", "--no-progress"])

    assert_same_bits_and_parallel(over_thread_counts(monkeypatch, run), parallel_in=())


def test_gpt_tiny_tp(monkeypatch):
    mod = _load("gpt_tiny_tp")
    results = over_thread_counts(
        monkeypatch, lambda: mod.train(mod.Config(), 2, 2, 2, verbose=False))
    assert_same_bits_and_parallel(results, parallel_in=())      # tiny: nothing to split
