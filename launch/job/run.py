"""The main job: `popxl-run [--backend B] [--workers W] CONFIG.yaml [--run-dir DIR]
[--resume DIR] [--set key=value ...] [--stop-at-step N]`.

`prepare` checks everything (config, overrides, data, workers, run folder) without writing;
`Job.run` builds the training and test programs, owns both sessions for the whole run, streams
MNIST into them, evaluates every `test.eval_every` steps and at the end (copying the trained
weights into the test session each time), checkpoints with `TaskSession.save_checkpoint`, and
prints the test accuracy and the weights digest.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .config import (Config, ConfigError, apply_sets, check_workers, load_config, resolve,
                     schema_lines)
from .data import check_data
from .rundir import RunDir, plan_run_dir

__all__ = ["parse_args", "prepare", "Job", "main", "run_job", "job_help"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:           # one line, exit status 2 via ConfigError
        raise ConfigError(message)


def _parser() -> _Parser:
    p = _Parser(prog="popxl-run", add_help=False,
                usage="popxl-run [--backend local|mpi|ray] [--workers W] CONFIG.yaml "
                      "[--run-dir DIR] [--resume DIR] [--set KEY=VALUE ...] [--stop-at-step N]",
                description="The built-in MNIST job: train and test programs from a YAML "
                            "config (configs/mnist.yaml, mnist_dp2_adam.yaml, mnist_rts.yaml).")
    p.add_argument("config", metavar="CONFIG.yaml", help="a config file, or the name of a "
                                                         "built-in one (configs/)")
    p.add_argument("--run-dir", help="folder for a new run (default runs/<config>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.epochs=3 (repeatable)")
    p.add_argument("--stop-at-step", type=int, default=0, metavar="N",
                   help="stop after step N with a checkpoint, as if interrupted (continue "
                        "later with --resume)")
    return p


def _lookup(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def job_help(config: str = "", argv: Sequence[str] = ()) -> str:
    """The job's usage and every config key with the value it takes in `config` (with the
    `--set` overrides of `argv`), marking those that differ from the code's default; the
    code's defaults alone when the config cannot be read."""
    lines = [_parser().format_help()]
    values, where = None, ""
    if config:
        try:
            source, data = load_config(config)
            sets = [a for i, a in enumerate(argv) if i and argv[i - 1] == "--set"]
            sets += [a[len("--set="):] for a in argv if a.startswith("--set=")]
            values = resolve(apply_sets(data, sets)).to_dict()
            where = source.name + (" with --set" if sets else "")
        except ConfigError as e:
            lines.append(f"({config} could not be read: {e})")
    if values is None:
        lines.append("config keys (default):")
        lines += [f"  {key} ({default!r}){': ' + doc if doc else ''}"
                  for key, default, doc in schema_lines()]
        return "\n".join(lines)
    lines.append(f"config keys (value in {where}; [default: ...] where it differs from the "
                 f"default):")
    for key, default, doc in schema_lines():
        value = _lookup(values, key)
        changed = f" [default: {default!r}]" if value != default else ""
        lines.append(f"  {key} ({value!r}){changed}{': ' + doc if doc else ''}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ns = _parser().parse_args(list(argv))
    if ns.stop_at_step < 0:
        raise ConfigError(f"--stop-at-step must be >= 1, got {ns.stop_at_step}")
    return ns


class Job:
    """A checked job: its config, where it writes, how it stops."""

    def __init__(self, cfg: Config, source: Path, run_dir: RunDir, stop_at_step: int,
                 argv: Sequence[str], backend: str = "local", workers: int = 1):
        self.cfg = cfg
        self.source = source
        self.run_dir = run_dir
        self.stop_at_step = stop_at_step
        self.argv = list(argv)
        self.backend = backend
        self.workers = workers

    def run(self) -> int:
        from .loop import train_and_test

        return train_and_test(self)


def prepare(argv: Sequence[str], backend: str, workers: int) -> Job:
    """Parse and check a YAML job; raises ConfigError (nothing is started or written)."""
    ns = parse_args(argv)
    source, data = load_config(ns.config)
    cfg = resolve(apply_sets(data, ns.set))
    check_workers(cfg, backend, workers)
    check_data(cfg)
    run_dir = plan_run_dir(cfg, source, ns.run_dir, ns.resume)
    return Job(cfg, source, run_dir, ns.stop_at_step, argv, backend, workers)


def _usage_error(e: ConfigError) -> int:
    print(f"popxl-run: {e}", file=sys.stderr, flush=True)
    return 2


def run_job(job: Job) -> int:
    """Run a prepared job in this process (the host). Exit status: 0, 2 for bad input found
    while loading (e.g. torchvision data), 130 when interrupted; failures raise."""
    try:
        return job.run()
    except ConfigError as e:
        return _usage_error(e)


def main(argv: Sequence[str], backend: str, workers: int) -> int:
    """Check and run a YAML job in this process (`popxl-run`'s MPI rank 0 calls this)."""
    try:
        job = prepare(argv, backend, workers)
    except ConfigError as e:
        return _usage_error(e)
    return run_job(job)
