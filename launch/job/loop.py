"""The main job's loop: train, evaluate, checkpoint, report."""
from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from .config import describe
from .data import EpochLoader, load_data
from .programs import IMAGE_SIZE, TestProgram, TrainProgram, build_test_program, \
    build_train_program
from .report import MetricsLog, plot_metrics, read_metrics, weights_digest

__all__ = ["train_and_test", "evaluate", "plot_title"]


def evaluate(train: TrainProgram, test: TestProgram, images: np.ndarray, labels: np.ndarray,
             batch_size: int) -> Tuple[float, float]:
    """(test accuracy in %, seconds the weight copy took): copy the trained weights into the
    test session, then classify `images` in batches of `batch_size` (the last one padded)."""
    mapping = {train.weights[k]: test.weights[k] for k in train.weights.keys_flat()}
    t0 = time.perf_counter()
    train.session.copy_weights_to(test.session, mapping)
    copy_s = time.perf_counter() - t0
    per_replica = batch_size // int(np.prod(test.lead, dtype=np.int64))
    batch = np.zeros((batch_size, IMAGE_SIZE), np.float32)
    correct = 0
    for lo in range(0, len(images), batch_size):
        chunk = images[lo:lo + batch_size]
        batch[:len(chunk)] = chunk
        batch[len(chunk):] = 0
        x = batch.reshape(test.lead + (per_replica, IMAGE_SIZE))
        out = test.session.run({test.images: x})[test.predictions]
        correct += int(np.sum(out.reshape(-1)[:len(chunk)] == labels[lo:lo + len(chunk)]))
    return 100.0 * correct / len(images), copy_s


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


class _CheckpointNotWritten(Exception):
    def __init__(self, step: int, error: OSError):
        super().__init__(f"step {step}: {error}")
        self.step, self.error = step, error


class _Run:
    """One job's programs, data and bookkeeping."""

    def __init__(self, job):
        cfg, rd = job.cfg, job.run_dir
        self.job, self.cfg, self.rd = job, cfg, rd
        data = load_data(cfg)
        self.resume_from: Optional[Tuple[int, Path]] = None     # chosen by restore()
        if not rd.resume:
            rd.create(cfg, job.source)
        for line in describe(cfg):
            _say(line)
        self.train = build_train_program(cfg)
        self.test = build_test_program(cfg, self.train.sharded_keys)
        self.session = self.train.session
        self.loader = EpochLoader(data.train_images, data.train_labels, cfg.train.global_batch,
                                  self.train.lead, cfg.seed)
        self.session.dataloader = self.loader
        total = self.loader.steps_per_epoch * cfg.train.epochs
        self.total = min(total, cfg.train.steps) if cfg.train.steps else total
        n_test = min(cfg.test.limit or len(data.test_images), len(data.test_images))
        self.test_x, self.test_y = data.test_images[:n_test], data.test_labels[:n_test]
        self.metrics: Optional[MetricsLog] = None                  # opened by restore()
        self.step_times: List[float] = []
        self.copy_times: List[float] = []
        self.saved_at = -1

    def _rows_to_keep(self):
        """Which metrics rows a resumed run keeps: those up to its checkpoint, except the
        final evaluation of a finished run (it is evaluated again)."""
        at = self.resume_from[0] if self.resume_from else 0

        def keep(row) -> bool:
            step = row.get("step", 0)
            return step < at or (step == at and ("loss" in row or at < self.total))
        return keep

    def restore(self) -> int:
        """Load the newest checkpoint that reads back whole (sessions attached), naming and
        setting aside any newer one that does not; open the metrics. The step to continue
        at."""
        skipped = []
        if self.rd.resume:
            for step, path in self.rd.complete_checkpoints():
                try:
                    _check_session_info(path / "session_info.json")
                    self.session.load_checkpoint(str(path), report_missing="error")
                except (OSError, ValueError) as e:
                    aside = path.with_name(f"unreadable_{path.name}")
                    try:
                        path.rename(aside)
                    except OSError:
                        aside = path
                    print(f"popxl-run: checkpoint {path} cannot be loaded: {e}; set aside as "
                          f"{aside.name}", file=sys.stderr, flush=True)
                    skipped.append(path.name)
                    continue
                self.resume_from = (step, path)
                break
        self.metrics = MetricsLog(str(self.rd.metrics),
                                  self._rows_to_keep() if self.rd.resume else None)
        if self.resume_from:
            self.saved_at = self.resume_from[0]
            newest = f" (the newest complete checkpoint, {self.resume_from[1].name}; " \
                     f"{', '.join(skipped)} could not be loaded)" if skipped else ""
            _say(f"Resumed {self.rd.path} at step {self.session.session_state['steps']} "
                 f"(epoch {self.loader.epoch + 1}, batch {self.loader.position}){newest}")
        elif self.rd.resume:
            why = "no checkpoint could be loaded" if skipped else "no checkpoint yet"
            _say(f"Resumed {self.rd.path}: {why}, starting from step 0")
        return self.session.session_state["steps"]

    def train_step(self) -> Tuple[int, float, float]:
        """One optimiser step: (step number, mean loss, samples/s)."""
        t0 = time.perf_counter()
        x, y = next(self.loader)
        inputs = self.session.inputs
        out = self.session.run({inputs.images: x, inputs.labels: y})
        dt = time.perf_counter() - t0
        self.step_times.append(dt)
        step = self.session.session_state["steps"]
        loss = float(np.mean(out[self.session.outputs.loss]))
        rate = self.cfg.train.global_batch / dt
        self.metrics.write(step=step, epoch=self.loader.epoch + 1, loss=loss,
                           samples_per_s=rate)
        return step, loss, rate

    def evaluate(self, step: int) -> float:
        acc, copy_s = evaluate(self.train, self.test, self.test_x, self.test_y,
                               self.cfg.test.batch_size)
        self.copy_times.append(copy_s)
        self.metrics.write(step=step, test_accuracy=acc, weight_copy_ms=copy_s * 1e3)
        return acc

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.train.checkpoint_every
        epoch_end = self.loader.position == self.loader.steps_per_epoch
        return (every and step % every == 0) or (not every and epoch_end) or step == self.total

    def checkpoint(self, step: int) -> None:
        if self.saved_at != step:
            try:
                self.session.save_checkpoint(str(self.rd.checkpoint(step)))
            except OSError as e:
                raise _CheckpointNotWritten(step, e) from e
            self.saved_at = step
            self._prune()

    def _prune(self) -> None:
        """Keep `train.max_checkpoints` checkpoints in the run folder, counting those of the
        runs this one resumed (the TaskSession counts only its own)."""
        import shutil

        for _, path in self.rd.complete_checkpoints()[self.cfg.train.max_checkpoints:]:
            shutil.rmtree(path, ignore_errors=True)

    def resume_command(self) -> str:
        """The command that continues this run where it was launched: same backend and
        workers (the digest does not depend on them, the run's speed does)."""
        job = self.job
        placement = "" if job.backend == "local" and job.workers == 1 else \
            f"--backend {job.backend} --workers {job.workers} "
        sets = "".join(f" --set {shlex.quote(s)}" for s in _sets(job.argv))
        return (f"popxl-run {placement}{shlex.quote(str(job.source))} --resume "
                f"{shlex.quote(str(self.rd.path))}{sets}")

    def plot_title(self) -> str:
        job = self.job
        return plot_title(self.cfg, self.rd.path.name, job.source.name, job.backend,
                          job.workers)

    def timing(self, total_s: float) -> str:
        parts = [f"Time: {total_s:.1f} s"]
        if self.step_times:
            parts.append(f"one training step: median "
                         f"{statistics.median(self.step_times) * 1e3:.2f} ms over "
                         f"{len(self.step_times)}")
        if self.copy_times:
            parts.append(f"train->test weight copy: median "
                         f"{statistics.median(self.copy_times) * 1e3:.2f} ms per evaluation "
                         f"over {len(self.copy_times)}")
        return "; ".join(parts)


def _check_session_info(path: Path) -> None:
    """A ValueError naming `path` unless it holds the job's session state: a JSON object whose
    "steps" is a count of steps (checked before anything of its checkpoint is loaded)."""
    with open(path) as f:
        try:
            info = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path} is not JSON ({e})") from None
    steps = info.get("steps") if isinstance(info, dict) else None
    if not isinstance(info, dict) or type(steps) is not int or steps < 0:
        raise ValueError(f"{path} does not hold the job's session state (a JSON object with "
                         f"\"steps\": a count of steps), got {json.dumps(info)[:80]}")


def _resume_point(run: _Run) -> str:
    """What a resumed run would start from: the latest checkpoint, or the start."""
    last = run.rd.latest_checkpoint()
    return f"the checkpoint of step {last[0]}" if last else "the start"


def train_and_test(job) -> int:
    """Run `job` (a `run.Job`); returns the exit status."""
    t_start = time.perf_counter()
    run = _Run(job)
    eval_every, total = run.cfg.test.eval_every, run.total
    step = 0
    bar: Optional[tqdm] = None
    try:
        with run.session, run.test.session:
            step = run.restore()
            bar = tqdm(total=total, initial=step, desc="Training", unit="step", disable=None,
                       dynamic_ncols=True, file=sys.stdout)
            while step < total:
                step, loss, rate = run.train_step()
                bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} samples/s", refresh=False)
                bar.update(1)
                if eval_every and step % eval_every == 0 and step < total:
                    _say(f"step {step}: test accuracy {run.evaluate(step):.2f}%")
                if run.checkpoint_due(step):
                    run.checkpoint(step)
                if job.stop_at_step and step >= job.stop_at_step and step < total:
                    run.checkpoint(step)
                    bar.close()
                    _say(f"Stopped at step {step} (--stop-at-step); continue with: "
                         f"{run.resume_command()}")
                    return 0
            bar.close()
            acc = run.evaluate(step)
            named = run.session.get_tensors_data(run.train.weights.tensors)
            digest = weights_digest({t.name: a for t, a in named.items()})
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        where = _resume_point(run)
        print(f"\nInterrupted at step {step}; continue from {where} with: "
              f"{run.resume_command()}", file=sys.stderr, flush=True)
        return 130
    except _CheckpointNotWritten as e:          # a full disk, a read-only folder ...
        if bar is not None:
            bar.close()
        where = _resume_point(run)
        print(f"popxl-run: cannot write the checkpoint of step {e.step}: {e.error}; continue "
              f"from {where} with: {run.resume_command()}", file=sys.stderr, flush=True)
        return 1
    finally:
        if run.metrics is not None:
            run.metrics.close()
    _say(f"Accuracy on test set: {acc:.2f}%")
    _say(f"weights digest: {digest}")
    _say(plot_metrics(read_metrics(str(run.rd.metrics)), str(run.rd.plot), run.plot_title()))
    _say(f"Run folder: {run.rd.path} (config.yaml, metrics.jsonl, checkpoints/)")
    _say(run.timing(time.perf_counter() - t_start))
    return 0


def plot_title(cfg, run_name: str, config_name: str, backend: str, workers: int) -> str:
    """The run's name and what it trained (the plot's title)."""
    t = cfg.train
    opt = getattr(t, t.optimizer)
    sizes = "-".join(str(n) for n in [IMAGE_SIZE, *cfg.model.hidden, 10])
    where = backend + (f" x{workers}" if workers > 1 else "")
    return (f"{run_name} ({config_name}): MLP {sizes} {cfg.model.activation}, "
            f"{t.replicas} replica{'s' if t.replicas > 1 else ''} x {t.accumulation} "
            f"accumulation, batch {t.global_batch}, {t.optimizer} lr {opt.lr:g}, "
            f"{t.epochs} epoch{'s' if t.epochs > 1 else ''}"
            + (f" (stop at step {t.steps})" if t.steps else "") + f"; {where}")


def _sets(argv: List[str]) -> List[str]:
    """The `--set` values of a command line."""
    out = []
    for i, a in enumerate(argv):
        if a == "--set" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--set="):
            out.append(a[6:])
    return out
