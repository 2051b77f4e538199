"""The main job's report pieces: the weights digest, the metrics log (kept rows on resume, a
cut last line) and the plot."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from popxl_launch.job.report import (MetricsLog, metrics_figure, plot_metrics, read_metrics,
                                     weights_digest)


def test_weights_digest_is_sha256_in_name_order():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.5], dtype=np.float32)
    h = hashlib.sha256()
    for name, arr in (("a", a), ("b", b)):
        h.update(name.encode())
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
    assert weights_digest({"b": b, "a": a}) == h.hexdigest()
    assert weights_digest({"a": a, "b": b}) == weights_digest({"b": b, "a": a.copy()})
    assert weights_digest({"a": a.T.copy().T, "b": b}) == h.hexdigest()     # layout-free
    c = a.copy()
    c[1, 2] = np.nextafter(c[1, 2], np.float32(10))      # one bit
    assert weights_digest({"a": c, "b": b}) != h.hexdigest()
    assert weights_digest({"a": a.reshape(3, 2), "b": b}) != h.hexdigest()


def test_metrics_log_appends_and_keeps_rows_up_to_a_resumed_step(tmp_path):
    path = str(tmp_path / "m.jsonl")
    log = MetricsLog(path)
    for step in range(1, 6):
        log.write(step=step, loss=1.0 / step)
    log.write(step=5, test_accuracy=50.0)
    log.close()
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')                      # cut by an interruption
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5, 5]
    log = MetricsLog(path, keep=lambda r: r["step"] <= 3)
    log.write(step=4, loss=0.3)
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]
    assert read_metrics(path)[-1] == {"step": 4, "loss": 0.3}
    assert read_metrics(str(tmp_path / "none.jsonl")) == []


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"step": s, "loss": 1.0 / s, "samples_per_s": 100.0 + s} for s in range(1, 391)] + \
           [{"step": 390, "test_accuracy": 95.21}]
    msg = plot_metrics(rows, str(tmp_path / "p.png"), "run-1 (mnist.yaml)")
    assert msg == f"plot: {tmp_path / 'p.png'}"
    assert (tmp_path / "p.png").stat().st_size > 1000
    fig = metrics_figure(rows, "run-1 (mnist.yaml)")
    ax_loss, ax_acc, ax_rate = fig.axes
    assert fig.get_suptitle() == "run-1 (mnist.yaml)"
    assert ax_loss.get_yscale() == "log" and ax_loss.get_ylim()[0] <= 1 / 390
    assert [len(line.get_xdata()) for line in ax_loss.lines] == [390, 390]   # each, averaged
    assert ax_acc.get_xlim()[0] <= 1 and ax_acc.get_xlim()[1] >= 390   # the run's steps,
    lo, hi = ax_acc.get_ylim()                                          # not 370..410
    assert lo <= 94.21 and 96.21 <= hi <= 100
    assert [t.get_text() for t in ax_acc.texts] == ["95.21%"]
    assert ax_rate.get_ylim()[0] == 0 and ax_rate.get_ylim()[1] >= 490
    # a loss that reaches 0 (every probability rounded to 1) is a gap on the log axis
    zero = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.0}, {"step": 3, "loss": 0.25}]
    drawn = metrics_figure(zero).axes[0].lines[0].get_ydata()
    assert drawn[0] == 0.5 and np.isnan(drawn[1]) and drawn[2] == 0.25
    assert plot_metrics([], str(tmp_path / "empty.png")).startswith("plot: ")
