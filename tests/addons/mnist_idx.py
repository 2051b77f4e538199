"""Read the offline MNIST IDX gzip files for the addons tests (small, dependency-free)."""
from __future__ import annotations

import gzip
import os
from typing import Iterator, Tuple

import numpy as np

from popxl_launch.data import PACKAGED_MNIST

MNIST_DIR = os.environ.get("POPXL_MNIST_DIR", str(PACKAGED_MNIST))
MEAN, STD = 0.1307, 0.3081


def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(train: bool, limit: int) -> Tuple[np.ndarray, np.ndarray]:
    """`limit` normalised images (N, 28, 28) float32 and labels (N,) int32."""
    prefix = "train" if train else "t10k"
    images = _read_idx(os.path.join(MNIST_DIR, f"{prefix}-images-idx3-ubyte.gz"))[:limit]
    labels = _read_idx(os.path.join(MNIST_DIR, f"{prefix}-labels-idx1-ubyte.gz"))[:limit]
    x = ((images.astype(np.float32) / 255.0) - MEAN) / STD
    return x.astype(np.float32), labels.astype(np.int32)


def batches(train: bool, batch_size: int, n_batches: int,
            seed: int = 0) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """`n_batches` batches drawn with a fixed shuffle (the training subset is sorted by label)."""
    x, y = load(train, 10 ** 6)
    order = np.random.default_rng(seed).permutation(len(y))[: batch_size * n_batches]
    x, y = x[order], y[order]
    for i in range(n_batches):
        yield x[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size]
