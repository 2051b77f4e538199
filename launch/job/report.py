"""What a run leaves behind: metrics as JSON lines, a plot of loss, accuracy and throughput, the
weights digest."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import numpy as np

__all__ = ["MetricsLog", "read_metrics", "metrics_figure", "plot_metrics", "weights_digest"]


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


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over `window` points (shorter at the ends)."""
    if window <= 1 or len(values) < 3:
        return values
    kernel = np.ones(window)
    num = np.convolve(values, kernel, mode="same")
    den = np.convolve(np.ones_like(values), kernel, mode="same")
    return num / den


def metrics_figure(rows: Iterable[Mapping[str, Any]], title: str = ""):
    """The run's plot as a matplotlib Figure (not saved): training loss on a log scale (each
    step, and a moving average), test accuracy at each evaluation (its value written beside
    the last point, the axis kept at least a few points wide), and throughput (samples/s,
    moving median; the axis from 0, ignoring the slow first steps). The panels share the
    step axis of the whole run, so one evaluation is a point at its step, not the middle of
    an axis of its own."""
    from matplotlib.figure import Figure

    rows = list(rows)
    train = [r for r in rows if "loss" in r]
    test = [r for r in rows if "test_accuracy" in r]
    steps = np.array([r["step"] for r in train], dtype=np.float64)
    loss = np.array([r["loss"] for r in train], dtype=np.float64)
    rate = np.array([r.get("samples_per_s", np.nan) for r in train], dtype=np.float64)
    window = max(1, len(train) // 50)
    last = max([r["step"] for r in rows], default=1)

    fig = Figure(figsize=(15, 4.6), layout="constrained")
    ax_loss, ax_acc, ax_rate = fig.subplots(1, 3, sharex=True)
    if title:
        fig.suptitle(title, fontsize=10)
    if (loss > 0).any():              # a log axis shows no 0: such a step is a gap in the line
        smooth = _smooth(loss, window)
        ax_loss.plot(steps, np.where(loss > 0, loss, np.nan), linewidth=0.6, alpha=0.35,
                     color="tab:blue", label="each step")
        ax_loss.plot(steps, np.where(smooth > 0, smooth, np.nan), linewidth=1.6,
                     color="tab:blue", label=f"mean of {window} steps" if window > 1 else None)
        if window > 1:
            ax_loss.legend(loc="upper right", fontsize=8)
    ax_loss.set_yscale("log")
    ax_loss.set(xlabel="step", ylabel="training loss (log scale)", title="Training loss")

    if test:
        t_steps = [r["step"] for r in test]
        acc = np.array([r["test_accuracy"] for r in test], dtype=np.float64)
        ax_acc.plot(t_steps, acc, marker="o", color="tab:green")
        ax_acc.annotate(f"{acc[-1]:.2f}%", (t_steps[-1], acc[-1]), textcoords="offset points",
                        xytext=(-6, 8), ha="right", fontsize=9)
        pad = max(1.0, 0.1 * float(acc.max() - acc.min()))
        ax_acc.set_ylim(max(0.0, float(acc.min()) - pad), min(100.0, float(acc.max()) + pad))
    ax_acc.set(xlabel="step", ylabel="test accuracy (%)",
               title=f"Test accuracy ({len(test)} evaluation{'s' if len(test) != 1 else ''})")

    finite = np.isfinite(rate)
    if finite.any():
        ax_rate.plot(steps[finite], rate[finite], linewidth=0.6, alpha=0.35, color="tab:orange")
        med = np.array([np.median(rate[finite][max(0, i - window // 2):i + window // 2 + 1])
                        for i in range(int(finite.sum()))])
        ax_rate.plot(steps[finite], med, linewidth=1.6, color="tab:orange")
        ax_rate.set_ylim(0, 1.15 * float(np.percentile(rate[finite], 99)))
    ax_rate.set(xlabel="step", ylabel="samples/s", title="Throughput")

    first_epoch = [r["step"] for r in train if r.get("epoch") == 1]
    per_epoch = max(first_epoch) if first_epoch and len(first_epoch) < len(train) else 0
    for ax in (ax_loss, ax_acc, ax_rate):
        ax.grid(alpha=0.3, which="both")
        if per_epoch:                 # several epochs: an epoch scale along the top
            ax.secondary_xaxis("top", functions=(lambda s: s / per_epoch,
                                                 lambda e: e * per_epoch)).set_xlabel("epoch")
    ax_loss.set_xlim(0, last * 1.02)
    return fig


def plot_metrics(rows: Iterable[Mapping[str, Any]], path: str, title: str = "") -> str:
    """Draw `metrics_figure(rows, title)` into `path` (PNG); returns the line to print (where it
    went, or why there is no plot)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ('plot skipped: matplotlib not installed (the plot extra: pip install -e '
                '".[plot]" in the popxl-dist clone)')
    metrics_figure(rows, title).savefig(path, dpi=100)
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
