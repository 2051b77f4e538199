"""examples/mnist_popdist.py in one process: its sharding of the global batch is the data-parallel
example's replica layout, and with 4 replicas it trains exactly as `mnist_data_parallel.py`
does (the same weights, bit for bit). Its multi-instance launches are tested in
tests/popxl_dist/runtime/test_instances.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from popxl_launch.data import load_mnist

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Program:
    """The layout a TrainProgram gives `sharded_batches`."""

    def __init__(self, dp, replicas: int):
        self.accumulation, self.replicas, self.micro_batch = 2, replicas, 3
        self.host_shape = lambda *s: dp.TrainProgram.host_shape(self, *s)


def test_instances_get_their_replicas_of_each_global_batch():
    pd, dp = _load("mnist_popdist"), _load("mnist_data_parallel")
    images, labels = load_mnist("train")
    images, labels = images[:120], labels[:120]
    whole = list(pd.sharded_batches(images, labels, _Program(dp, 4), 4, 0, epoch=1))
    for offset, local in ((0, 2), (2, 2), (3, 1)):
        part = list(pd.sharded_batches(images, labels, _Program(dp, local), 4, offset, epoch=1))
        assert len(part) == len(whole) == 120 // 24
        for (x, y), (wx, wy) in zip(part, whole):
            want_x, want_y = wx[:, offset:offset + local], wy[:, offset:offset + local]
            if local == 1:
                want_x, want_y = want_x[:, 0], want_y[:, 0]
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(y, want_y)


def test_one_process_trains_like_the_data_parallel_example(tmp_path, monkeypatch):
    for var in ("PMI_RANK", "PMI_SIZE", "POPDIST_NUM_TOTAL_REPLICAS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    pd, dp = _load("mnist_popdist"), _load("mnist_data_parallel")
    args = ["--replicas", "4", "--limit", "2", "--test-batches", "1", "--no-progress"]
    assert pd.main([*args, "--save-weights", str(tmp_path / "a.npz"),
                    "--save-losses", str(tmp_path)]) == 0
    assert dp.main([*args, "--save-weights", str(tmp_path / "b.npz")]) == 0
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert a.files == b.files
        for k in a.files:
            assert a[k].tobytes() == b[k].tobytes(), k
    losses = np.load(tmp_path / "losses_0-3.npy")
    assert losses.shape == (2, 4, 4) and np.all(np.isfinite(losses))
