"""`popxl-run CONFIG.yaml` end to end on the local backend, in process: the run folder and its
output, resume giving the uninterrupted run's weights bit for bit, and every bad input (exit
status 2, one clear line, nothing written over an existing run)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from popxl_launch.cli import main

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs" / "mnist.yaml")
# 10 steps an epoch, 2 epochs, evaluated every 5 steps, a checkpoint every 3 steps.
SHORT = ["--set", "model.hidden=[32]", "--set", "train.global_batch=32",
         "--set", "data.train_limit=320", "--set", "train.epochs=2",
         "--set", "test.limit=300", "--set", "test.batch_size=100",
         "--set", "test.eval_every=5", "--set", "train.checkpoint_every=3"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("POPXL_BACKEND", "POPXL_WORKERS"):
        monkeypatch.delenv(var, raising=False)


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def digest_of(text: str) -> str:
    found = re.findall(r"^weights digest: ([0-9a-f]{64})$", text, re.M)
    assert len(found) == 1, text
    return found[0]


def accuracy_of(text: str) -> float:
    found = re.findall(r"^Accuracy on test set: (\d+\.\d\d)%$", text, re.M)
    assert len(found) == 1, text
    return float(found[0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted short run (local backend, one worker)."""
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([CONFIG, "--run-dir", str(run_dir), *SHORT])
    out, err = out.getvalue(), err.getvalue()
    assert code == 0, out + err
    return run_dir, out


def test_run_folder_and_output(reference):
    run_dir, out = reference
    assert 0.0 <= accuracy_of(out) <= 100.0
    digest_of(out)
    assert "\r" not in out                       # no progress bar when not a terminal
    assert f"Run folder: {run_dir}" in out
    assert "one training step: median" in out and "weight copy: median" in out
    assert sorted(os.listdir(run_dir)) == sorted(
        ["checkpoints", "config.yaml", "metrics.jsonl", "run.json"]
        + (["metrics.png"] if "plot: " in out else []))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "test_accuracy" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    assert [r["epoch"] for r in train] == [1] * 10 + [2] * 10
    assert all(r["samples_per_s"] > 0 and r["loss"] > -1e-6 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert [r["step"] for r in evals] == [5, 10, 15, 20]
    assert round(evals[-1]["test_accuracy"], 2) == accuracy_of(out)
    assert all(r["weight_copy_ms"] >= 0 for r in evals)
    # max_checkpoints (2) of the ones every 3 steps, and the last step's.
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step_00000018", "step_00000020"]
    ckpt = run_dir / "checkpoints" / "step_00000020"
    assert json.loads((ckpt / "session_info.json").read_text()) == {"steps": 20}
    model = sorted(os.listdir(ckpt / "model"))
    assert "model.fc1.weight.npz" in model and "optimizer.fc1.weight.velocity.npz" in model
    record = json.loads((run_dir / "run.json").read_text())
    assert record["config"] == CONFIG and len(record["fingerprint"]) == 64


@pytest.mark.parametrize("drop_latest", [False, True])
def test_resume_gives_the_uninterrupted_weights(capsys, tmp_path, reference, drop_latest):
    run_dir = tmp_path / "run"
    code, out, err = run(capsys, CONFIG, "--run-dir", str(run_dir), *SHORT,
                         "--stop-at-step", "7")
    assert code == 0, err
    assert "Stopped at step 7" in out and f"--resume {run_dir}" in out
    assert "weights digest" not in out
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step_00000006", "step_00000007"]
    if drop_latest:
        # As if killed before writing step 7's checkpoint: steps 7.. are redone.
        shutil.rmtree(run_dir / "checkpoints" / "step_00000007")
    code, out, err = run(capsys, CONFIG, "--resume", str(run_dir), *SHORT)
    assert code == 0, err
    assert f"at step {6 if drop_latest else 7}" in out
    assert digest_of(out) == digest_of(reference[1])
    assert accuracy_of(out) == accuracy_of(reference[1])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))
    assert [r["step"] for r in rows if "test_accuracy" in r] == [5, 10, 15, 20]
    ref_rows = (reference[0] / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(r)["loss"] for r in ref_rows if '"loss"' in r]
    assert [r["loss"] for r in rows if "loss" in r] == losses


def test_resume_without_a_checkpoint_starts_over(capsys, tmp_path, reference):
    run_dir = tmp_path / "run"
    assert run(capsys, CONFIG, "--run-dir", str(run_dir), *SHORT, "--stop-at-step", "2")[0] == 0
    shutil.rmtree(run_dir / "checkpoints")
    code, out, err = run(capsys, CONFIG, "--resume", str(run_dir), *SHORT)
    assert code == 0, err
    assert "no checkpoint yet, starting from step 0" in out
    assert digest_of(out) == digest_of(reference[1])


def test_local_worker_threads_give_the_same_digest(capsys, tmp_path, reference):
    code, out, err = run(capsys, "--workers", "2", CONFIG, "--run-dir", str(tmp_path / "r"),
                         *SHORT)
    assert code == 0, err
    assert digest_of(out) == digest_of(reference[1])


PLOT_ARGS = [CONFIG, *SHORT, "--set", "train.steps=2", "--set", "test.limit=100"]


def test_plot_skipped_without_matplotlib(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)         # not installed
    code, out, err = run(capsys, *PLOT_ARGS, "--run-dir", str(tmp_path / "a"))
    assert code == 0, err
    assert "plot skipped: matplotlib not installed" in out
    assert not (tmp_path / "a" / "metrics.png").exists()
    assert (tmp_path / "a" / "metrics.jsonl").exists()


def _run_figure(run_dir: Path):
    """The run's plot as the job draws it (its metrics, its title), and its rows."""
    import yaml

    from popxl_launch.job.config import resolve
    from popxl_launch.job.loop import plot_title
    from popxl_launch.job.report import metrics_figure, read_metrics

    rows = read_metrics(str(run_dir / "metrics.jsonl"))
    cfg = resolve(yaml.safe_load((run_dir / "config.yaml").read_text()))
    return metrics_figure(rows, plot_title(cfg, run_dir.name, "mnist.yaml", "local", 1)), rows


def _check_figure(fig, rows, run_name):
    """The plot of `rows`: loss on a log scale, every panel over the whole run's steps, the
    accuracy axis a few points wide around the evaluations, throughput from 0."""
    ax_loss, ax_acc, ax_rate = fig.axes
    last = max(r["step"] for r in rows)
    title = fig.get_suptitle()
    assert title.startswith(f"{run_name} (mnist.yaml): MLP 784-32-10 gelu, 2 replicas x 1 "
                            f"accumulation, batch 32, sgd lr 0.1"), title
    assert ax_loss.get_yscale() == "log" and ax_acc.get_yscale() == "linear"
    for ax in (ax_loss, ax_acc, ax_rate):
        lo, hi = ax.get_xlim()
        assert lo <= 1 and last <= hi <= last * 1.1, (ax.get_title(), lo, hi)
    losses = [r["loss"] for r in rows if "loss" in r]
    lo, hi = ax_loss.get_ylim()
    assert lo <= min(losses) and max(losses) <= hi
    accs = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
    lo, hi = ax_acc.get_ylim()
    assert 0 <= lo <= min(accs) and max(accs) <= hi <= 100 and hi - lo >= 2
    assert f"{accs[-1]:.2f}%" in [t.get_text() for t in ax_acc.texts]
    assert ax_rate.get_ylim()[0] == 0
    assert ax_rate.get_ylim()[1] > max(r["samples_per_s"] for r in rows if "loss" in r) / 2


def test_plot_of_a_run_with_many_evaluations(reference):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    run_dir, _ = reference
    fig, rows = _run_figure(run_dir)
    _check_figure(fig, rows, run_dir.name)
    assert fig.axes[1].get_title() == "Test accuracy (4 evaluations)"
    assert len(fig.axes[1].lines[0].get_xdata()) == 4
    image = matplotlib.image.imread(str(run_dir / "metrics.png"))
    assert image.shape[:2] == (460, 1500)               # 15 x 4.6 inches at 100 dpi


def test_plot_of_a_run_with_one_evaluation(capsys, tmp_path):
    """One evaluation (at the end): a point at its step on the run's step axis."""
    pytest.importorskip("matplotlib")
    code, out, err = run(capsys, *PLOT_ARGS, "--set", "train.steps=12", "--set",
                         "test.eval_every=0", "--run-dir", str(tmp_path / "b"))
    assert code == 0, err
    png = tmp_path / "b" / "metrics.png"
    assert f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig, rows = _run_figure(tmp_path / "b")
    _check_figure(fig, rows, "b")
    assert fig.axes[1].get_title() == "Test accuracy (1 evaluation)"
    assert "(stop at step 12); local" in fig.get_suptitle()


def test_default_run_folder_is_under_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "configs/mnist.yaml", *SHORT, "--set", "train.steps=1",
                         "--set", "test.limit=100")
    assert code == 0, err
    (folder,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"mnist-\d{8}-\d{6}", folder.name)
    assert f"Run folder: runs/{folder.name}" in out


# --- bad input ---------------------------------------------------------------------------
def snapshot(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*"))}


@pytest.fixture(scope="module")
def existing(reference, tmp_path_factory):
    """A copy of the reference run: bad input must leave it exactly as it is."""
    path = tmp_path_factory.mktemp("existing") / "run"
    shutil.copytree(reference[0], path)
    return path


def bad_input_cases(tmp: Path, existing: Path):
    idx = tmp / "idx"
    idx.mkdir(exist_ok=True)
    (idx / "train-images-idx3-ubyte.gz").write_bytes(b"")
    malformed = tmp / "malformed.yaml"
    malformed.write_text("train: {epochs: 3\n")
    other = tmp / "other.yaml"
    other.write_text("train: {epochs: 9}\n")
    not_a_run = tmp / "not_a_run"
    not_a_run.mkdir(exist_ok=True)
    (not_a_run / "notes.txt").write_text("mine")
    return [
        ([str(tmp / "missing.yaml")], "no such config file"),
        ([str(malformed)], "malformed YAML (line 2"),
        ([CONFIG, "--set", "trian.epochs=1"], "unknown key 'trian'; did you mean 'train'?"),
        ([str(other), "--set", "train.epoch=1"], "did you mean 'train.epochs'?"),
        ([CONFIG, "--set", "train.epochs"], "expected key.path=value"),
        ([CONFIG, "--set", "train.epochs=many"], "train.epochs: expected int, got 'many'"),
        ([CONFIG, "--set", "train.global_batch=63"], "not divisible by train.replicas x"),
        ([CONFIG, "--set", f"data.dir={idx}"], "has no MNIST file 'train-labels-idx1-ubyte'"),
        (["--workers", "3", CONFIG], "train.replicas 2 is not divisible by --workers 3"),
        ([CONFIG, "--resume", str(not_a_run)], "not a popxl-run run folder"),
        ([CONFIG, "--resume", str(existing), *SHORT, "--set", "train.epochs=3"],
         "written by another config (train.epochs: 2 there, 3 here)"),
        ([CONFIG, "--run-dir", str(existing)], "already holds a run; continue it with "
                                               "--resume"),
        ([CONFIG, "--run-dir", str(not_a_run)], "exists and is not an empty folder"),
        ([CONFIG, "--run-dir", str(tmp / "x"), "--resume", str(existing), *SHORT],
         "either --run-dir"),
        ([CONFIG, "--bogus"], "unrecognized arguments: --bogus"),
        ([CONFIG, "--stop-at-step", "-1"], "--stop-at-step must be >= 1"),
    ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(capsys, tmp_path, existing,
                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = bad_input_cases(tmp_path, existing)
    before = snapshot(tmp_path)
    for args, message in cases:
        code, out, err = run(capsys, *args)
        assert code == 2, (args, out, err)
        assert err.startswith("popxl-run: ") and err.count("\n") == 1, (args, err)
        assert message in err, (args, err)
        assert out == "", (args, out)
        assert snapshot(tmp_path) == before, args
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_then_resume(capsys, tmp_path, reference, monkeypatch):
    """Ctrl-C during step 9 (on 2 worker threads): exit status 130, the way to continue is
    printed with the same placement, and the resumed run (here on one worker) redoes steps 7..
    from the checkpoint of step 6 and ends with the reference weights."""
    import popxl_addons

    real_run = popxl_addons.TaskSession.run

    def interrupted(self, *a, **k):
        if self.session_state["steps"] == 8:
            raise KeyboardInterrupt
        return real_run(self, *a, **k)

    run_dir = tmp_path / "run"
    monkeypatch.setattr(popxl_addons.TaskSession, "run", interrupted)
    code, out, err = run(capsys, "--workers", "2", CONFIG, "--run-dir", str(run_dir), *SHORT)
    assert code == 130
    assert (f"Interrupted at step 8; continue from the checkpoint of step 6 with: popxl-run "
            f"--backend local --workers 2 {CONFIG} --resume {run_dir} --set "
            f"'model.hidden=[32]' --set train.global_batch=32") in err
    monkeypatch.setattr(popxl_addons.TaskSession, "run", real_run)
    code, out, err = run(capsys, CONFIG, "--resume", str(run_dir), *SHORT)
    assert code == 0, err
    assert digest_of(out) == digest_of(reference[1])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))


def test_rts_config_resumes_bitwise(capsys, tmp_path):
    """configs/mnist_rts.yaml (RTS weights, Adam state in remote buffers, 4 replicas) on 2
    worker threads: stopped and resumed equals uninterrupted."""
    config = str(ROOT / "configs" / "mnist_rts.yaml")
    short = [*SHORT, "--set", "train.rts_threshold=256", "--set", "train.epochs=1"]
    code, out, err = run(capsys, "--workers", "2", config, "--run-dir", str(tmp_path / "a"),
                         *short)
    assert code == 0, err
    assert "RTS weights and remote optimiser state" in out
    model = os.listdir(tmp_path / "a" / "checkpoints" / "step_00000010" / "model")
    assert "optimizer.fc1.weight.first_order.npz" in model
    assert run(capsys, config, "--run-dir", str(tmp_path / "b"), *short,
               "--stop-at-step", "4")[0] == 0
    code, resumed, err = run(capsys, "--workers", "2", config, "--resume", str(tmp_path / "b"),
                             *short)
    assert code == 0, err
    assert digest_of(resumed) == digest_of(out)


def test_help_lists_the_options_and_every_key_with_the_configs_values(capsys):
    code, out, err = run(capsys, CONFIG, "--help")
    assert code == 0 and err == ""
    for text in ("--run-dir", "--resume", "--set KEY=VALUE", "--stop-at-step",
                 "value in mnist.yaml", "train.global_batch (128) [default: 64]",
                 "train.epochs (30) [default: 1]", "train.sgd.lr (0.1) [default: 0.05]",
                 "train.replicas (2)\n", "data.source ('auto')"):
        assert text in out, text
    code, out, err = run(capsys, CONFIG, "--set", "train.epochs=3", "-h")
    assert code == 0 and "value in mnist.yaml with --set" in out
    assert "train.epochs (3) [default: 1]" in out
    code, out, err = run(capsys, "nothing.yaml", "--help")
    assert code == 0 and "(nothing.yaml could not be read: no such config file" in out
    assert "train.global_batch (64)" in out and "config keys (default):" in out


def test_resuming_a_finished_run_evaluates_it_again(capsys, tmp_path, reference):
    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    code, out, err = run(capsys, CONFIG, "--resume", str(run_dir), *SHORT)
    assert code == 0, err
    assert "at step 20" in out
    assert digest_of(out) == digest_of(reference[1])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "test_accuracy" in r] == [5, 10, 15, 20]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))
