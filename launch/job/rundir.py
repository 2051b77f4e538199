"""The run folder: resolved config, run record, metrics, plot and checkpoints.

    <run dir>/config.yaml          the resolved config (every key)
    <run dir>/run.json             config fingerprint, source, creation time: marks a run
    <run dir>/metrics.jsonl        one JSON object per training step / evaluation
    <run dir>/metrics.png          loss and accuracy plot (with matplotlib)
    <run dir>/checkpoints/step_N/  TaskSession checkpoints

Every check happens in `plan_run_dir`, before anything is written: a folder that holds a run is
only ever continued (`--resume`), and only with the config that made it. A new run claims its
folder atomically (`reserve`, `create`): jobs started at the same moment never share one (a
default name another job took moves on to the next free one; an explicit `--run-dir` that
another job claimed first is refused).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .config import Config, ConfigError, fingerprint

__all__ = ["RunDir", "plan_run_dir"]

_MARKER = "run.json"


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class RunDir:
    """Paths of one run folder; `create` writes its config and record.

    `auto` is the default name's stem (`runs/<config>-<time>`) when the folder was not named
    by the user: taken by another job, the name moves on to `<stem>-2`, `<stem>-3` ..."""

    def __init__(self, path: Path, resume: bool, auto: Optional[Path] = None):
        self.path = path
        self.resume = resume
        self.auto = auto

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def plot(self) -> Path:
        return self.path / "metrics.png"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:08d}"

    def complete_checkpoints(self) -> List[Tuple[int, Path]]:
        """(step, folder) of every whole checkpoint (its session_info.json, written last, is
        readable), newest first."""
        found = []
        for d in self.checkpoints.glob("step_*"):
            try:
                step = int(d.name[5:])
                with open(d / "session_info.json") as f:
                    json.load(f)
            except (ValueError, OSError):
                continue
            found.append((step, d))
        return sorted(found, reverse=True)

    def latest_checkpoint(self) -> Optional[Tuple[int, Path]]:
        """(step, folder) of the newest whole checkpoint, or None."""
        found = self.complete_checkpoints()
        return found[0] if found else None

    def reserve(self) -> None:
        """Create the folder of a new run, atomically: a default name another job took in the
        meantime moves on to the next free one."""
        if self.resume:
            return
        if self.auto is None:
            self.path.mkdir(parents=True, exist_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            try:
                os.mkdir(self.path)
                return
            except FileExistsError:
                n += 1
                self.path = self.auto.with_name(f"{self.auto.name}-{n}")

    def create(self, cfg: Config, source: Path) -> None:
        """Claim the folder for a new run (run.json, created exclusively) and write its
        config.yaml. Raises ConfigError if another job claimed it first."""
        import yaml

        self.reserve()
        record = {"fingerprint": fingerprint(cfg), "config": str(source),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        try:
            with open(self.path / _MARKER, "x") as f:
                json.dump(record, f, indent=1)
        except FileExistsError:
            raise ConfigError(f"run folder {self.path} was claimed by another job started at "
                              f"the same time; choose another --run-dir") from None
        with open(self.path / "config.yaml", "w") as f:
            f.write(f"# resolved from {source}\n")
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)


def _differences(saved: Path, cfg: Config) -> str:
    """The first few keys whose values differ between a run's config.yaml and `cfg`."""
    import yaml

    try:
        old = _flat(yaml.safe_load(saved.read_text()) or {})
    except (OSError, yaml.YAMLError):
        return "its config.yaml is unreadable"
    new = _flat(cfg.to_dict())
    diffs = [f"{k}: {old.get(k)!r} there, {new.get(k)!r} here"
             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else "") if diffs else \
        "fingerprints differ"


def plan_run_dir(cfg: Config, config_path: Path, run_dir: Optional[str],
                 resume: Optional[str]) -> RunDir:
    """Check the run folder arguments (nothing is written): a new folder (`--run-dir`, or
    `runs/<config name>-<time>`), or a run to continue (`--resume`)."""
    if resume:
        path = Path(resume).expanduser()
        if run_dir and Path(run_dir).expanduser().resolve() != path.resolve():
            raise ConfigError("give either --run-dir (a new run) or --resume (a run to "
                              "continue), not both")
        if not (path / _MARKER).is_file():
            raise ConfigError(f"--resume {resume}: not a popxl-run run folder (no {_MARKER})")
        try:
            record = json.loads((path / _MARKER).read_text())
        except (OSError, json.JSONDecodeError):
            raise ConfigError(f"--resume {resume}: its {_MARKER} is unreadable") from None
        if record.get("fingerprint") != fingerprint(cfg):
            raise ConfigError(f"--resume {resume}: the run was written by another config ("
                              f"{_differences(path / 'config.yaml', cfg)})")
        return RunDir(path, resume=True)
    if run_dir:
        path = Path(run_dir).expanduser()
        if (path / _MARKER).exists():
            raise ConfigError(f"--run-dir {run_dir} already holds a run; continue it with "
                              f"--resume {run_dir}, or choose another folder")
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigError(f"--run-dir {run_dir} exists and is not an empty folder")
        return RunDir(path, resume=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{config_path.stem}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return RunDir(path, resume=False, auto=base)
