"""The main job gives the same weights digest with POPXL_THREADS 1, 2, 4 and the default (its two
replicas on one worker: 2 threads run the replicas at once, 4 also split their ops)."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from popxl_launch.cli import main
from thread_counts import assert_same_bits_and_parallel, over_thread_counts

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs" / "mnist.yaml")
# The main job's model (784-512-512-512-10, 2 replicas, global batch 128), a few steps.
SHORT = ["--set", "data.train_limit=640", "--set", "train.epochs=1",
         "--set", "test.limit=1000", "--set", "test.batch_size=500",
         "--set", "test.eval_every=5", "--set", "train.checkpoint_every=5"]


def test_main_job_digest_does_not_depend_on_the_thread_count(monkeypatch, tmp_path):
    monkeypatch.delenv("POPXL_BACKEND", raising=False)
    monkeypatch.delenv("POPXL_WORKERS", raising=False)
    runs = iter(range(100))

    def run():
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main([CONFIG, "--run-dir", str(tmp_path / f"run{next(runs)}"), *SHORT])
        text = out.getvalue()
        assert code == 0, text
        found = (re.findall(r"^weights digest: ([0-9a-f]{64})$", text, re.M),
                 re.findall(r"^Accuracy on test set: .*$", text, re.M))
        assert [len(f) for f in found] == [1, 1], text
        return found

    results = over_thread_counts(monkeypatch, run)
    assert_same_bits_and_parallel(results, parallel_in=("4",))
