"""The main job's config: schema with defaults, YAML loading, `--set key=value` overrides and
validation with clear one-line errors (unknown keys get a did-you-mean).

A config is nested sections of typed keys (`SCHEMA`); every key has a default, so a config file
only needs what it changes. `resolve()` gives the complete config as plain dicts, which is what
the run folder stores and what `--resume` compares.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

__all__ = ["ConfigError", "SCHEMA", "load_config", "apply_sets", "resolve", "fingerprint",
           "find_config", "check_workers", "describe", "schema_lines", "Config",
           "BUILTIN_CONFIGS"]

# configs/ of a clone (editable install), or its copy inside the installed package (`pip install .`)
BUILTIN_CONFIGS = next((d for d in (Path(__file__).resolve().parents[1] / "configs",
                                    Path(__file__).resolve().parents[2] / "configs") if d.is_dir()),
                       Path(__file__).resolve().parents[2] / "configs")


class ConfigError(ValueError):
    """Bad job input (config, `--set`, run folder, data): the launcher prints it on one line and
    exits with status 2."""


class _Key:
    """One config key: its type(s), default, and allowed values or bounds."""

    def __init__(self, types, default, choices: Sequence = (), minimum=None, doc: str = ""):
        self.types = types if isinstance(types, tuple) else (types,)
        self.default = default
        self.choices = tuple(choices)
        self.minimum = minimum
        self.doc = doc

    def check(self, path: str, value: Any) -> Any:
        if value is None and type(None) in self.types:
            return None
        ok = isinstance(value, self.types) and not (isinstance(value, bool)
                                                    and bool not in self.types)
        if float in self.types and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if float in self.types and isinstance(value, str):
            try:                     # YAML 1.1 reads `1e-8` (no dot) as a string
                value, ok = float(value), True
            except ValueError:
                pass
        if list in self.types and isinstance(value, list):
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if not ok:
            names = " or ".join("null" if t is type(None) else
                                "list of ints" if t is list else t.__name__ for t in self.types)
            raise ConfigError(f"{path}: expected {names}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{path}: must be one of {', '.join(map(str, self.choices))}; "
                              f"got {value!r}")
        low = self.minimum
        if low is not None:
            values = value if isinstance(value, list) else [value]
            if any(v < low for v in values):
                raise ConfigError(f"{path}: must be >= {low}, got {value!r}")
        return value


_POS = dict(minimum=1)
_NONNEG = dict(minimum=0)

SCHEMA: Dict[str, Any] = {
    "seed": _Key(int, 42, doc="weight initialisation and data order"),
    "model": {
        "hidden": _Key(list, [512, 512, 512], minimum=1, doc="hidden layer widths"),
        "activation": _Key(str, "gelu", choices=("gelu", "relu")),
    },
    "train": {
        "replicas": _Key(int, 2, **_POS),
        "accumulation": _Key(int, 1, **_POS, doc="micro batches per optimiser step"),
        "global_batch": _Key(int, 64, **_POS, doc="images per optimiser step"),
        "epochs": _Key(int, 1, **_POS),
        "steps": _Key(int, 0, **_NONNEG, doc="stop after this many steps (0: all epochs)"),
        "optimizer": _Key(str, "sgd", choices=("sgd", "adam")),
        "loss_scaling": _Key(float, 1.0, minimum=0.0),
        "rts": _Key(bool, False, doc="shard large weights (and their optimiser state) over "
                                     "the replicas, optimiser state in remote buffers"),
        "rts_threshold": _Key(int, 1024, **_POS, doc="elements of a weight worth sharding"),
        "checkpoint_every": _Key(int, 0, **_NONNEG, doc="steps (0: at the end of each epoch)"),
        "max_checkpoints": _Key(int, 2, **_POS),
        "sgd": {
            "lr": _Key(float, 0.05, minimum=0.0),
            "momentum": _Key(float, 0.9, minimum=0.0),
            "weight_decay": _Key(float, 0.0, minimum=0.0),
        },
        "adam": {
            "lr": _Key(float, 1e-3, minimum=0.0),
            "beta1": _Key(float, 0.9, minimum=0.0),
            "beta2": _Key(float, 0.999, minimum=0.0),
            "eps": _Key(float, 1e-5, minimum=0.0),
            "weight_decay": _Key(float, 0.0, minimum=0.0),
        },
    },
    "test": {
        "batch_size": _Key(int, 1000, **_POS, doc="test images per run (split over replicas)"),
        "eval_every": _Key(int, 0, **_NONNEG, doc="steps between evaluations (0: at the end)"),
        "limit": _Key(int, 0, **_NONNEG, doc="evaluate the first N test images (0: all)"),
    },
    "data": {
        "source": _Key(str, "auto", choices=("auto", "packaged", "idx", "torchvision"),
                       doc="auto: idx when data.dir is set, else the packaged copy"),
        "dir": _Key((str, type(None)), None, doc="IDX files, or torchvision's root"),
        "train_limit": _Key(int, 0, **_NONNEG, doc="train on a seeded random N-image subset "
                                                   "(0: all images)"),
    },
}


def schema_lines(schema: Dict[str, Any] = SCHEMA, prefix: str = "") -> List[Tuple[str, Any, str]]:
    """(dotted key, default, doc) of every config key."""
    out = []
    for key, spec in schema.items():
        if isinstance(spec, dict):
            out += schema_lines(spec, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", spec.default, spec.doc))
    return out


def _defaults(schema: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default)
            for k, v in schema.items()}


def _did_you_mean(key: str, options: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else \
        f"; known keys: {', '.join(prefix + o for o in sorted(options))}"


def _merge(schema: Dict[str, Any], into: Dict[str, Any], data: Any, prefix: str) -> None:
    """Check `data` against `schema` and write its values over `into`."""
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(f"{where}: expected a mapping of keys, got {data!r}")
    for key, value in data.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or key not in schema:
            raise ConfigError(f"unknown key '{path}'" +
                              _did_you_mean(str(key), list(schema), prefix))
        spec = schema[key]
        if isinstance(spec, dict):
            _merge(spec, into[key], value, f"{path}.")
        else:
            into[key] = spec.check(path, value)


def find_config(path: str) -> Path:
    """The config file `path`, or a built-in config of that name (`configs/mnist.yaml` works
    from any directory when popxl-dist is installed from a clone)."""
    p = Path(path)
    if p.is_file():
        return p
    for cand in (BUILTIN_CONFIGS / p.name, BUILTIN_CONFIGS / f"{p.name}.yaml"):
        if cand.is_file():
            return cand
    known = sorted(c.name for c in BUILTIN_CONFIGS.glob("*.yaml")) if BUILTIN_CONFIGS.is_dir() \
        else []
    hint = f" (built-in configs: {', '.join(known)})" if known else ""
    raise ConfigError(f"no such config file: {path}{hint}")


def load_config(path: str) -> Tuple[Path, Dict[str, Any]]:
    """(resolved path, the config's own (partial) dict) of a YAML file."""
    import yaml

    found = find_config(path)
    try:
        text = found.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {found}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{found}: malformed YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{found}: a config is a mapping of keys, got "
                          f"{type(data).__name__}")
    return found, data


def apply_sets(data: Dict[str, Any], sets: Sequence[str]) -> Dict[str, Any]:
    """`data` with each `key.path=value` of `sets` applied (values parsed as YAML)."""
    import yaml

    data = copy.deepcopy(data)
    for item in sets:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected key.path=value, e.g. "
                              f"--set train.epochs=3")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML") from None
        node, schema = data, SCHEMA
        parts = key.split(".")
        for i, part in enumerate(parts):
            path = ".".join(parts[:i + 1])
            if part not in schema:
                raise ConfigError(f"--set: unknown key '{path}'" +
                                  _did_you_mean(part, list(schema), path[:-len(part)]))
            if i == len(parts) - 1:
                if isinstance(schema[part], dict):
                    raise ConfigError(f"--set: '{path}' is a section; set one of its keys "
                                      f"({', '.join(schema[part])})")
                node[part] = value
            else:
                if not isinstance(schema[part], dict):
                    raise ConfigError(f"--set: '{path}' is not a section")
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node, schema = node[part], schema[part]
    return data


class Config:
    """The resolved config: nested attribute access (`cfg.train.replicas`) over plain dicts."""

    def __init__(self, data: Dict[str, Any]):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        return Config(value) if isinstance(value, dict) else value

    def to_dict(self) -> Dict[str, Any]:
        return copy.deepcopy(self._data)

    @property
    def micro_batch(self) -> int:
        t = self.train
        return t.global_batch // (t.replicas * t.accumulation)

    @property
    def test_micro_batch(self) -> int:
        return self.test.batch_size // self.train.replicas


def resolve(data: Dict[str, Any]) -> Config:
    """The complete, checked config: defaults overridden by `data`."""
    full = _defaults(SCHEMA)
    _merge(SCHEMA, full, data, "")
    cfg = Config(full)
    t = cfg.train
    if t.global_batch % (t.replicas * t.accumulation):
        raise ConfigError(
            f"train.global_batch {t.global_batch} is not divisible by train.replicas x "
            f"train.accumulation = {t.replicas} x {t.accumulation} = "
            f"{t.replicas * t.accumulation}")
    if cfg.test.batch_size % t.replicas:
        raise ConfigError(f"test.batch_size {cfg.test.batch_size} is not divisible by "
                          f"train.replicas {t.replicas} (the test program splits each batch "
                          f"over the same replicas)")
    if t.loss_scaling <= 0:
        raise ConfigError(f"train.loss_scaling: must be > 0, got {t.loss_scaling!r}")
    if t.rts and t.replicas < 2:
        raise ConfigError("train.rts needs train.replicas >= 2 (weights are sharded over "
                          "the replicas)")
    d = cfg.data
    if d.source == "idx" and not d.dir:
        raise ConfigError("data.source 'idx' needs data.dir (a folder of MNIST IDX files)")
    if d.source == "packaged" and d.dir:
        raise ConfigError(f"data.dir is set ({d.dir}) but data.source is 'packaged'; use "
                          f"source 'idx' (or 'auto') to read it")
    return cfg


def fingerprint(cfg: Config) -> str:
    """sha256 of the resolved config (what `--resume` requires to match)."""
    text = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def check_workers(cfg: Config, backend: str, workers: int) -> None:
    """The job's placement rule: W divides R. More worker processes than CPUs are allowed, as
    for scripts (the launcher prints a note)."""
    R = cfg.train.replicas
    if R % workers:
        raise ConfigError(f"train.replicas {R} is not divisible by --workers {workers} "
                          f"(every worker holds the same number of replicas)")


def describe(cfg: Config) -> List[str]:
    """Short human lines about the run's shape."""
    t = cfg.train
    opt = getattr(t, t.optimizer)
    lines = [f"Training: {t.replicas} replica(s) x {t.accumulation} accumulation step(s) x "
             f"micro batch {cfg.micro_batch} = {t.global_batch} images per step, "
             f"{t.optimizer} (lr {opt.lr:g})"
             + (f", loss scaling {t.loss_scaling:g}" if t.loss_scaling != 1 else "")
             + (", RTS weights and remote optimiser state" if t.rts else "")]
    return lines
