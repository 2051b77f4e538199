"""The main job's data: MNIST from the packaged copy, a folder of IDX files or torchvision, and a
resumable epoch loader (seeded shuffles; its position and RNG state go into checkpoints)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, NamedTuple, Tuple

import numpy as np

from ..data import _FILES, PACKAGED_MNIST, _find, load_mnist, normalise
from .config import Config, ConfigError

__all__ = ["Dataset", "check_data", "load_data", "EpochLoader", "TORCHVISION_ROOT"]

IMAGE_SIZE = 28 * 28
TORCHVISION_ROOT = "~/.torch/datasets"     # the seed tutorials' root


class Dataset(NamedTuple):
    """Normalised float32 images `(N, 784)` and int32 labels `(N,)` of both splits."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def source_of(cfg: Config) -> str:
    d = cfg.data
    if d.source == "auto":
        return "idx" if d.dir else "packaged"
    return d.source


def check_data(cfg: Config) -> None:
    """Check that the configured data can be found (before anything is started or written)."""
    source = source_of(cfg)
    if source == "idx":
        folder = Path(cfg.data.dir).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"data.dir {cfg.data.dir}: no such directory")
        for stems in _FILES.values():
            for stem in stems:
                try:
                    _find(folder, stem)
                except FileNotFoundError:
                    raise ConfigError(f"data.dir {cfg.data.dir} has no MNIST file '{stem}' "
                                      f"(or '{stem}.gz')") from None
    elif source == "torchvision":
        try:
            import torchvision  # noqa: F401
        except ImportError:
            raise ConfigError("data.source 'torchvision' needs torchvision: pip install "
                              "torchvision (or use the packaged copy: data.source packaged)") \
                from None


def _torchvision_split(root: str, train: bool) -> Tuple[np.ndarray, np.ndarray]:
    import torchvision

    try:
        ds = torchvision.datasets.MNIST(os.path.expanduser(root), train=train, download=False)
    except RuntimeError as e:
        raise ConfigError(f"torchvision MNIST not found under {root} ({e}); popxl-run never "
                          f"downloads: put the files in {root}/MNIST/raw") from None
    return np.asarray(ds.data.numpy(), np.uint8), np.asarray(ds.targets.numpy(), np.int32)


def load_data(cfg: Config) -> Dataset:
    """Both splits of the configured source, normalised and flattened."""
    source = source_of(cfg)
    if source == "torchvision":
        root = cfg.data.dir or TORCHVISION_ROOT
        (tri, trl), (tei, tel) = (_torchvision_split(root, True),
                                  _torchvision_split(root, False))
    else:
        folder = PACKAGED_MNIST if source == "packaged" else Path(cfg.data.dir).expanduser()
        try:
            (tri, trl), (tei, tel) = load_mnist("train", folder), load_mnist("test", folder)
        except (OSError, ValueError) as e:
            raise ConfigError(f"MNIST in {folder}: {e}") from None
    if cfg.data.train_limit and cfg.data.train_limit < len(tri):
        # A seeded random subset (files may be sorted by label, as the packaged copy is).
        keep = np.sort(np.random.default_rng(cfg.seed).permutation(len(tri))
                       [:cfg.data.train_limit])
        tri, trl = tri[keep], trl[keep]
    if len(tri) < cfg.train.global_batch:
        raise ConfigError(f"train.global_batch {cfg.train.global_batch} is larger than the "
                          f"{len(tri)} training images")

    def prep(images: np.ndarray) -> np.ndarray:
        return normalise(images).reshape(len(images), IMAGE_SIZE)

    return Dataset(prep(tri), trl.astype(np.int32), prep(tei), tel.astype(np.int32))


class EpochLoader:
    """Global batches of a shuffled epoch, one per optimiser step, in a program's host layout.

    Each epoch is a permutation drawn from one seeded `np.random.Generator`. `save(path)`
    writes the epoch, the position in it and the generator's state at the start of the epoch;
    `resume(path)` redraws that epoch's permutation and continues at the position, so a
    resumed run sees the data in exactly the order of an uninterrupted one.
    (The `dataloader` of a `popxl_addons.TaskSession`.)

    Args:
        images, labels: the training split.
        global_batch: images per step; a last partial batch of an epoch is dropped.
        lead: the host layout's leading axes (accumulation, replicas) with size-1 axes left
            out; a batch is split in this order, then into micro batches.
        seed: the shuffle seed.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, global_batch: int,
                 lead: Tuple[int, ...], seed: int):
        self.images, self.labels = images, labels
        self.global_batch = global_batch
        self.lead = lead
        self.micro = global_batch // int(np.prod(lead, dtype=np.int64))
        self.steps_per_epoch = len(images) // global_batch
        self._rng = np.random.default_rng(seed)
        self.epoch = 0
        self.position = 0
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._epoch_rng_state = self._rng.bit_generator.state
        self._order = self._rng.permutation(len(self.images))

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        return self

    def __next__(self) -> Tuple[np.ndarray, np.ndarray]:
        """The next step's (images, labels) shaped `(*lead, micro, 784)` / `(*lead, micro)`."""
        if self.position == self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
            self._start_epoch()
        lo = self.position * self.global_batch
        idx = self._order[lo:lo + self.global_batch]
        self.position += 1
        x = self.images[idx].reshape(self.lead + (self.micro, IMAGE_SIZE))
        y = self.labels[idx].reshape(self.lead + (self.micro,))
        return x, y

    def save(self, path: str) -> None:
        state = {"epoch": self.epoch, "position": self.position,
                 "rng_state_at_epoch_start": self._epoch_rng_state,
                 "num_images": len(self.images), "global_batch": self.global_batch}
        with open(path, "w") as f:
            json.dump(state, f)

    def resume(self, path: str) -> None:
        """Continue from a state `save` wrote (checked whole before anything changes)."""
        with open(path) as f:
            try:
                state = json.load(f)
                keys = ("epoch", "position", "rng_state_at_epoch_start", "num_images",
                        "global_batch")
                if not isinstance(state, dict):
                    raise TypeError(f"a JSON {type(state).__name__}, not an object")
                missing = [k for k in keys if k not in state]
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path} is not a saved data position ({e})") from None
        if missing:
            raise ValueError(f"{path} is not a saved data position (no {', '.join(missing)})")
        if (state["num_images"], state["global_batch"]) != (len(self.images),
                                                           self.global_batch):
            raise ValueError(f"{path}: saved for {state['num_images']} images in batches of "
                             f"{state['global_batch']}, this loader has {len(self.images)} "
                             f"in batches of {self.global_batch}")
        epoch, position = state["epoch"], state["position"]
        if type(epoch) is not int or epoch < 0 or type(position) is not int or not (
                0 <= position <= self.steps_per_epoch):
            raise ValueError(f"{path}: epoch {epoch!r}, position {position!r} is no place in "
                             f"the data (an epoch >= 0 and a position from 0 to "
                             f"{self.steps_per_epoch}, the steps of an epoch)")
        rng = np.random.default_rng(0)        # checks the saved state before it is used
        try:
            rng.bit_generator.state = state["rng_state_at_epoch_start"]
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: rng_state_at_epoch_start is not the state of a "
                             f"{type(rng.bit_generator).__name__} generator ({e})") from None
        self._rng.bit_generator.state = state["rng_state_at_epoch_start"]
        self.epoch = epoch
        self._start_epoch()
        self.position = position
