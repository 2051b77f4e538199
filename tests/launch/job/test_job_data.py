"""The main job's data: sources (packaged, IDX folder, torchvision) and the resumable epoch
loader (seeded shuffles, host layout, save / resume)."""
from __future__ import annotations

import gzip
import shutil
import sys
import types

import numpy as np
import pytest

from popxl_launch.data import PACKAGED_MNIST, load_mnist, normalise
from popxl_launch.job.config import ConfigError, resolve
from popxl_launch.job.data import EpochLoader, check_data, load_data


def test_packaged_source_normalised_and_limited():
    cfg = resolve({"data": {"train_limit": 100}})
    data = load_data(cfg)
    images, labels = load_mnist("train")
    keep = np.sort(np.random.default_rng(cfg.seed).permutation(5000)[:100])
    assert data.train_images.shape == (100, 784) and data.train_images.dtype == np.float32
    np.testing.assert_array_equal(data.train_images, normalise(images[keep]).reshape(100, 784))
    np.testing.assert_array_equal(data.train_labels, labels[keep])
    assert len(set(data.train_labels)) == 10     # the packaged copy is sorted by label
    assert data.test_images.shape == (10000, 784) and data.test_labels.dtype == np.int32


def test_idx_folder_source(tmp_path):
    for f in PACKAGED_MNIST.glob("*.gz"):
        with gzip.open(f) as src, open(tmp_path / f.name[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)             # plain (not gzipped) IDX files
    cfg = resolve({"data": {"dir": str(tmp_path)}})
    check_data(cfg)
    data = load_data(cfg)
    np.testing.assert_array_equal(data.test_labels, load_mnist("test")[1])
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match=f"data.dir {tmp_path} has no MNIST file "
                                          f"'t10k-labels-idx1-ubyte' \\(or "
                                          f"'t10k-labels-idx1-ubyte.gz'\\)"):
        check_data(cfg)
    with pytest.raises(ConfigError, match="no such directory"):
        check_data(resolve({"data": {"dir": str(tmp_path / "nope")}}))


def test_torchvision_source(monkeypatch, tmp_path):
    """With torchvision's `datasets.MNIST(root, train=, download=False)` (a stand-in module
    with the same interface: `.data` / `.targets` tensors, here NumPy arrays behind torch's
    `.numpy()`) and without torchvision."""
    from references import TorchLikeTensor

    calls = []

    class MNIST:
        def __init__(self, root, train=True, download=True):
            calls.append((root, train, download))
            images, labels = load_mnist("train" if train else "test")
            if not (tmp_path / "MNIST").exists():
                raise RuntimeError("Dataset not found. You can use download=True to download it")
            self.data, self.targets = TorchLikeTensor(images[:50].copy()), \
                TorchLikeTensor(labels[:50].astype(np.int64))

    fake = types.ModuleType("torchvision")
    fake.datasets = types.SimpleNamespace(MNIST=MNIST)
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    cfg = resolve({"data": {"source": "torchvision", "dir": str(tmp_path)},
                   "train": {"global_batch": 32}})
    check_data(cfg)
    with pytest.raises(ConfigError, match="torchvision MNIST not found under .*never downloads"):
        load_data(cfg)
    (tmp_path / "MNIST").mkdir()
    data = load_data(cfg)
    assert calls[-2:] == [(str(tmp_path), True, False), (str(tmp_path), False, False)]
    np.testing.assert_array_equal(data.train_labels, load_mnist("train")[1][:50])
    assert data.train_images.shape == (50, 784)
    monkeypatch.setitem(sys.modules, "torchvision", None)     # not installed
    with pytest.raises(ConfigError, match="needs torchvision: pip install torchvision"):
        check_data(cfg)


def test_global_batch_larger_than_the_data():
    with pytest.raises(ConfigError, match="larger than the 10 training images"):
        load_data(resolve({"data": {"train_limit": 10}}))


def _loader(lead=(4, 2), batch=16, n=50, seed=3):
    images = np.arange(n * 784, dtype=np.float32).reshape(n, 784)
    return EpochLoader(images, np.arange(n, dtype=np.int32), batch, lead, seed)


def test_epochs_are_seeded_permutations_in_host_layout():
    loader = _loader()
    assert loader.steps_per_epoch == 3
    seen = []
    for _ in range(3):
        x, y = next(loader)
        assert x.shape == (4, 2, 2, 784) and y.shape == (4, 2, 2)
        np.testing.assert_array_equal(x[..., 0], y * 784)   # images and labels stay paired
        seen += list(y.reshape(-1))
    assert len(set(seen)) == 48                     # no repeats within an epoch (2 dropped)
    first_epoch = seen
    x, y = next(loader)
    assert loader.epoch == 1 and loader.position == 1
    rng = np.random.default_rng(3)
    order = rng.permutation(50)
    assert first_epoch == list(order[:48])          # (accumulation, replica, micro) order
    np.testing.assert_array_equal(y.reshape(-1), rng.permutation(50)[:16])


@pytest.mark.parametrize("stop", [1, 3, 4, 7])
def test_save_resume_continues_the_same_order(tmp_path, stop):
    a = _loader()
    straight = [next(a)[1] for _ in range(9)]
    b = _loader()
    for _ in range(stop):
        next(b)
    b.save(str(tmp_path / "dl.bin"))
    c = _loader(seed=99)                          # resume overrides its own seed's state
    c.resume(str(tmp_path / "dl.bin"))
    resumed = [next(c)[1] for _ in range(9 - stop)]
    for want, got in zip(straight[stop:], resumed):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="saved for 50 images in batches of 16"):
        _loader(batch=8).resume(str(tmp_path / "dl.bin"))


@pytest.mark.parametrize("change,why", [
    ({"position": 10**6}, r"epoch 0, position 1000000 is no place in the data \(an epoch >= 0 "
                          r"and a position from 0 to 3, the steps of an epoch\)"),
    ({"position": -1}, r"epoch 0, position -1 is no place in the data"),
    ({"position": 1.5}, r"epoch 0, position 1.5 is no place in the data"),
    ({"epoch": -2}, r"epoch -2, position 1 is no place in the data"),
    ({"rng_state_at_epoch_start": {"bit_generator": "PCG64"}},
     r"rng_state_at_epoch_start is not the state of a PCG64 generator"),
])
def test_resume_refuses_a_corrupt_position_naming_the_file(tmp_path, change, why):
    """A saved position outside the data (by hand, or a corrupt file) is refused naming the
    file, before the loader changes (it would otherwise fail later reshaping an empty batch)."""
    import json

    a = _loader()
    next(a)
    path = tmp_path / "dataloader.bin"
    a.save(str(path))
    state = json.loads(path.read_text())
    state.update(change)
    path.write_text(json.dumps(state))
    b = _loader()
    with pytest.raises(ValueError, match=rf"^{path}: {why}"):
        b.resume(str(path))
    assert (b.epoch, b.position) == (0, 0)
    np.testing.assert_array_equal(next(b)[1], next(_loader())[1])


@pytest.mark.parametrize("content", ["[1, 2]", "{}", '{"steps": "3"}', '{"steps": -1}'])
def test_a_session_info_without_a_step_count_is_named(tmp_path, content):
    from popxl_launch.job.loop import _check_session_info

    path = tmp_path / "session_info.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"^{path} does not hold the job's session state \(a "
                                         rf"JSON object with \"steps\": a count of steps\), "
                                         rf"got "):
        _check_session_info(path)
    path.write_text('{"steps": 3}')
    _check_session_info(path)
