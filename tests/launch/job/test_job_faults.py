"""The built-in job's run folder and checkpoints when things go wrong, with real `popxl-run`
processes (local backend): two jobs started at the same moment get two run folders; a corrupt
newest checkpoint is named and set aside, and the run resumes from the newest one that loads,
to the uninterrupted run's weights; `train.max_checkpoints` holds across a resume; a checkpoint
that cannot be written (the disk is full) ends the run with one line naming the file."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from popxl_launch.job.config import resolve
from popxl_launch.job.rundir import plan_run_dir

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs" / "mnist.yaml")
# 10 steps an epoch, 2 epochs, a checkpoint every 3 steps, 2 kept.
SHORT = ["--set", "model.hidden=[32]", "--set", "train.global_batch=32",
         "--set", "data.train_limit=320", "--set", "train.epochs=2",
         "--set", "test.limit=300", "--set", "test.batch_size=100",
         "--set", "test.eval_every=5", "--set", "train.checkpoint_every=3"]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}


def start(*args: str, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "popxl_launch", CONFIG, *SHORT, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=_env())


def popxl_run(*args: str, cwd) -> subprocess.CompletedProcess:
    proc = start(*args, cwd=cwd)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def digest(text: str) -> str:
    found = re.findall(r"^weights digest: ([0-9a-f]{64})$", text, re.M)
    assert len(found) == 1, text
    return found[0]


def test_two_runs_planned_together_claim_two_folders(tmp_path, monkeypatch):
    """The race itself, made certain: both jobs picked the same free default name before
    either created it."""
    monkeypatch.chdir(tmp_path)
    cfg = resolve({})
    a = plan_run_dir(cfg, Path(CONFIG), None, None)
    b = plan_run_dir(cfg, Path(CONFIG), None, None)
    assert a.path == b.path
    a.create(cfg, Path(CONFIG))
    b.create(cfg, Path(CONFIG))
    assert a.path != b.path and b.path.name == f"{a.path.name}-2"
    for rd in (a, b):
        assert (rd.path / "run.json").is_file() and (rd.path / "config.yaml").is_file()


def test_jobs_started_at_the_same_moment_get_their_own_run_folders(tmp_path):
    jobs = [start("--set", "train.steps=2", cwd=tmp_path) for _ in range(3)]
    results = [(j.communicate(timeout=300), j.returncode) for j in jobs]
    for (out, err), code in results:
        assert code == 0, out + err
    folders = sorted(os.listdir(tmp_path / "runs"))
    assert len(folders) == 3, folders
    for name in folders:
        rows = [json.loads(line) for line in
                (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == [1, 2]      # one run's rows only
    said = sorted(re.search(r"Run folder: runs/(\S+) ", out).group(1) for (out, _), _ in results)
    assert said == folders


def test_a_corrupt_newest_checkpoint_is_named_and_the_run_resumes_from_the_one_before(
        tmp_path):
    full = popxl_run("--run-dir", str(tmp_path / "full"), cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    run = tmp_path / "run"
    res = popxl_run("--run-dir", str(run), "--stop-at-step", "7", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    bad = run / "checkpoints" / "step_00000007" / "model" / "model.fc1.weight.npz"
    bad.write_bytes(bad.read_bytes()[:100])             # cut short, as by a crash mid-write
    res = popxl_run("--resume", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"checkpoint {run / 'checkpoints' / 'step_00000007'} cannot be loaded" in res.stderr
    assert str(bad) in res.stderr, res.stderr            # the file, by name
    assert "set aside as unreadable_step_00000007" in res.stderr
    assert "at step 6" in res.stdout and "step_00000006; step_00000007 could not be loaded" \
        in res.stdout, res.stdout
    assert digest(res.stdout) == digest(full.stdout)     # steps 7.. redone: the same weights
    # max_checkpoints (2) holds across the resume: the first run's checkpoints count too.
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == \
        ["step_00000018", "step_00000020"]


def test_a_checkpoint_that_cannot_be_written_names_the_file(tmp_path):
    run = tmp_path / "run"
    res = popxl_run("--run-dir", str(run), "--stop-at-step", "2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    model = run / "checkpoints" / "step_00000003" / "model"
    model.mkdir(parents=True)
    target = model / "model.fc1.weight.npz"
    target.symlink_to("/dev/full")                      # every write: ENOSPC, a full disk
    res = popxl_run("--resume", str(run), cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("popxl-run: cannot write"))
    assert "the checkpoint of step 3" in line and "[Errno 28] No space left on device" in line \
        and str(target) in line, line
    assert "Traceback" not in res.stderr, res.stderr
