"""MNIST for examples, tests and the main job: the packaged offline copy or a `--data-dir` of IDX
files (gzip or plain). No network access is ever attempted."""
from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Iterator, Optional, Tuple

import numpy as np

__all__ = ["PACKAGED_MNIST", "read_idx", "load_mnist", "normalise", "batches"]

PACKAGED_MNIST = Path(__file__).resolve().parent / "data" / "mnist"
MEAN, STD = 0.1307, 0.3081
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: os.PathLike) -> np.ndarray:
    """Read an IDX file (`.gz` or plain): big-endian magic, dimension sizes, uint8 data."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4]!r})")
    if raw[2] != 0x08:
        raise ValueError(f"{path}: only uint8 IDX data is supported, got type code {raw[2]:#x}")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">i4", count=ndim, offset=4)
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {int(np.prod(dims))} values for shape "
                         f"{tuple(dims)}, found {data.size}")
    return data.reshape(tuple(int(d) for d in dims))


def _find(data_dir: Path, stem: str) -> Path:
    for cand in (data_dir / f"{stem}.gz", data_dir / stem,
                 data_dir / "MNIST" / "raw" / stem, data_dir / "MNIST" / "raw" / f"{stem}.gz"):
        if cand.exists():
            return cand
    raise FileNotFoundError(f"MNIST file '{stem}(.gz)' not found in {data_dir}")


def load_mnist(split: str = "train", data_dir: Optional[os.PathLike] = None
               ) -> Tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int32 (N,)) of `split` ("train" or "test")."""
    if split not in _FILES:
        raise ValueError(f"load_mnist: split must be 'train' or 'test', got {split!r}")
    d = Path(data_dir) if data_dir is not None else PACKAGED_MNIST
    img_stem, lab_stem = _FILES[split]
    images = read_idx(_find(d, img_stem))
    labels = read_idx(_find(d, lab_stem)).astype(np.int32)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"MNIST {split}: {images.shape[0]} images but {labels.shape[0]} labels")
    return images, labels


def normalise(images: np.ndarray) -> np.ndarray:
    """uint8 images to float32, scaled to [0, 1] then normalised with MNIST's mean and std."""
    return ((images.astype(np.float32) / 255.0) - MEAN) / STD


def batches(images: np.ndarray, labels: np.ndarray, batch_size: int, shuffle: bool = True,
            seed: int = 0, drop_last: bool = True) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Yield (normalised float32 images, int32 labels) batches."""
    n = images.shape[0]
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        idx = order[i:i + batch_size]
        yield normalise(images[idx]), labels[idx]
