"""What a run leaves behind: metrics as JSON lines, a loss / accuracy plot, the weights digest."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import numpy as np

__all__ = ["MetricsLog", "read_metrics", "plot_metrics", "weights_digest"]


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """The rows of a metrics file (an unreadable last line, cut by an interruption, is
    dropped)."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


class MetricsLog:
    """Appends one JSON object per line (flushed, so an interrupted run keeps its rows).

    Rows are `{"step", "epoch", "loss", "samples_per_s"}` per training step and
    `{"step", "test_accuracy", "weight_copy_ms"}` per evaluation."""

    def __init__(self, path: str, keep: Optional[Callable[[Dict[str, Any]], bool]] = None):
        self.path = path
        if keep is not None:
            # A resumed run: the rows it redoes are dropped.
            rows = [r for r in read_metrics(path) if keep(r)]
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        self._f = open(path, "a")

    def write(self, **row: Any) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def plot_metrics(rows: Iterable[Mapping[str, Any]], path: str) -> str:
    """Draw training loss and test accuracy against the step into `path` (PNG); returns the
    line to print (where it went, or why there is no plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib not installed (pip install 'popxl-dist[plot]')"
    rows = list(rows)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    test = [(r["step"], r["test_accuracy"]) for r in rows if "test_accuracy" in r]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot(*zip(*train), linewidth=0.8)
    ax_loss.set(xlabel="step", ylabel="training loss", title="Loss")
    if test:
        ax_acc.plot(*zip(*test), marker="o")
    ax_acc.set(xlabel="step", ylabel="test accuracy (%)", title="Test accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot: {path}"


def weights_digest(named: Mapping[str, np.ndarray]) -> str:
    """sha256 over the weights in name order: each name, then its array's dtype, shape and
    C-order bytes. Equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name in sorted(named):
        arr = np.ascontiguousarray(named[name])
        h.update(name.encode())
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()
