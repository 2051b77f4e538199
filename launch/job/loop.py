"""The main job's loop: train, evaluate, checkpoint, report."""
from __future__ import annotations

import statistics
import sys
import time
from typing import Dict, List, Tuple

import numpy as np
from tqdm import tqdm

from .config import describe
from .data import EpochLoader, load_data
from .programs import IMAGE_SIZE, TestProgram, TrainProgram, build_test_program, \
    build_train_program
from .report import MetricsLog, plot_metrics, read_metrics, weights_digest

__all__ = ["train_and_test", "evaluate"]


def evaluate(train: TrainProgram, test: TestProgram, images: np.ndarray, labels: np.ndarray,
             batch_size: int) -> Tuple[float, float]:
    """(test accuracy in %, seconds the weight copy took): copy the trained weights into the
    test session, then classify `images` in batches of `batch_size` (the last one padded)."""
    mapping = {train.weights[k]: test.weights[k] for k in train.weights.keys_flat()}
    t0 = time.perf_counter()
    train.session.copy_weights_to(test.session, mapping)
    copy_s = time.perf_counter() - t0
    n = len(images)
    batch = np.zeros((batch_size, IMAGE_SIZE), np.float32)
    correct = 0
    for lo in range(0, n, batch_size):
        chunk = images[lo:lo + batch_size]
        batch[:len(chunk)] = chunk
        batch[len(chunk):] = 0
        x = batch.reshape(test.lead + (batch_size // int(np.prod(test.lead, dtype=int)),
                                       IMAGE_SIZE))
        out = test.session.run({test.images: x})[test.predictions]
        correct += int(np.sum(out.reshape(-1)[:len(chunk)] == labels[lo:lo + len(chunk)]))
    return 100.0 * correct / n, copy_s


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def train_and_test(job) -> int:
    """Run `job` (a `run.Job`); returns the exit status."""
    cfg, rd = job.cfg, job.run_dir
    t_start = time.perf_counter()
    data = load_data(cfg)
    resume_from = rd.latest_checkpoint() if rd.resume else None
    if not rd.resume:
        rd.create(cfg, job.source)
    for line in describe(cfg):
        _say(line)
    train = build_train_program(cfg)
    test = build_test_program(cfg, train.sharded_keys)
    session = train.session
    loader = EpochLoader(data.train_images, data.train_labels, cfg.train.global_batch,
                         train.lead, cfg.seed)
    session.dataloader = loader
    total = loader.steps_per_epoch * cfg.train.epochs
    if cfg.train.steps:
        total = min(total, cfg.train.steps)
    n_test = min(cfg.test.limit or len(data.test_images), len(data.test_images))
    test_x, test_y = data.test_images[:n_test], data.test_labels[:n_test]
    every = cfg.train.checkpoint_every
    eval_every = cfg.test.eval_every
    metrics = MetricsLog(str(rd.metrics), resume_from[0] if resume_from else
                         (0 if rd.resume else None))
    step_times: List[float] = []
    copy_times: List[float] = []
    saved_at = -1

    def checkpoint(step: int) -> None:
        nonlocal saved_at
        if saved_at != step:
            session.save_checkpoint(str(rd.checkpoint(step)))
            saved_at = step

    with session, test.session:
        if resume_from:
            session.load_checkpoint(str(resume_from[1]), report_missing="error")
            saved_at = resume_from[0]
            _say(f"Resumed {rd.path} at step {session.session_state['steps']} "
                 f"(epoch {loader.epoch + 1}, batch {loader.position})")
        elif rd.resume:
            _say(f"Resumed {rd.path}: no checkpoint yet, starting from step 0")
        step = session.session_state["steps"]
        inputs = session.inputs
        bar = tqdm(total=total, initial=step, desc="Training", unit="step", disable=None,
                   dynamic_ncols=True, file=sys.stdout)
        try:
            while step < total:
                t0 = time.perf_counter()
                x, y = next(loader)
                out = session.run({inputs.images: x, inputs.labels: y})
                dt = time.perf_counter() - t0
                step = session.session_state["steps"]
                step_times.append(dt)
                loss = float(np.mean(out[session.outputs.loss]))
                rate = cfg.train.global_batch / dt
                metrics.write(step=step, epoch=loader.epoch + 1, loss=loss, samples_per_s=rate)
                bar.update(1)
                bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} samples/s")
                if eval_every and step % eval_every == 0 and step < total:
                    acc, copy_s = evaluate(train, test, test_x, test_y, cfg.test.batch_size)
                    copy_times.append(copy_s)
                    metrics.write(step=step, test_accuracy=acc, weight_copy_ms=copy_s * 1e3)
                    _say(f"step {step}: test accuracy {acc:.2f}%")
                epoch_end = loader.position == loader.steps_per_epoch
                if (every and step % every == 0) or (not every and epoch_end) or step == total:
                    checkpoint(step)
                if job.stop_at_step and step >= job.stop_at_step and step < total:
                    checkpoint(step)
                    bar.close()
                    _say(f"Stopped at step {step} (--stop-at-step); continue with: popxl-run "
                         f"{job.source} --resume {rd.path}"
                         + "".join(f" --set {s}" for s in _sets(job.argv)))
                    metrics.close()
                    return 0
        except KeyboardInterrupt:
            bar.close()
            metrics.close()
            last = rd.latest_checkpoint()
            where = f"the checkpoint of step {last[0]}" if last else "the start"
            print(f"\nInterrupted at step {step}; continue from {where} with: popxl-run "
                  f"{job.source} --resume {rd.path}", file=sys.stderr, flush=True)
            return 130
        bar.close()
        acc, copy_s = evaluate(train, test, test_x, test_y, cfg.test.batch_size)
        copy_times.append(copy_s)
        metrics.write(step=step, test_accuracy=acc, weight_copy_ms=copy_s * 1e3)
        named = session.get_tensors_data(train.weights.tensors)
        digest = weights_digest({t.name: a for t, a in named.items()})
    metrics.close()
    _say(f"Accuracy on test set: {acc:.2f}%")
    _say(f"weights digest: {digest}")
    _say(plot_metrics(read_metrics(str(rd.metrics)), str(rd.plot)))
    _say(f"Run folder: {rd.path} (config.yaml, metrics.jsonl, checkpoints/)")
    _say(_timing(time.perf_counter() - t_start, step_times, copy_times))
    return 0


def _sets(argv: List[str]) -> List[str]:
    """The `--set` values of a command line."""
    out = []
    for i, a in enumerate(argv):
        if a == "--set" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--set="):
            out.append(a[6:])
    return out


def _timing(total_s: float, step_times: List[float], copy_times: List[float]) -> str:
    parts = [f"Time: {total_s:.1f} s"]
    if step_times:
        parts.append(f"one training step: median {statistics.median(step_times) * 1e3:.2f} ms "
                     f"over {len(step_times)}")
    if copy_times:
        parts.append(f"train->test weight copy: median {statistics.median(copy_times) * 1e3:.2f} "
                     f"ms per evaluation over {len(copy_times)}")
    return "; ".join(parts)
