"""The main job's config: defaults, the shipped configs, `--set`, and every validation error
(one clear line each)."""
from __future__ import annotations

from pathlib import Path

import pytest

from popxl_launch.job.config import (BUILTIN_CONFIGS, SCHEMA, ConfigError, apply_sets,
                                     check_workers, find_config, fingerprint, load_config,
                                     resolve)

ROOT = Path(__file__).resolve().parents[3]


def test_configs_folder_is_the_repos():
    assert BUILTIN_CONFIGS == ROOT / "configs"


@pytest.mark.parametrize("name, replicas, optimizer, rts", [
    ("mnist.yaml", 2, None, False),
    ("mnist_dp2_adam.yaml", 2, "adam", False),
    ("mnist_rts.yaml", 4, "adam", True),
])
def test_shipped_configs_resolve(name, replicas, optimizer, rts):
    path, data = load_config(str(ROOT / "configs" / name))
    cfg = resolve(data)
    assert cfg.train.replicas == replicas and cfg.train.rts == rts
    if optimizer:
        assert cfg.train.optimizer == optimizer
    if name == "mnist_dp2_adam.yaml":
        assert cfg.train.accumulation > 1


def test_defaults_and_overrides():
    cfg = resolve({})
    assert cfg.train.replicas == SCHEMA["train"]["replicas"].default
    assert cfg.model.hidden == [512, 512, 512]
    cfg = resolve(apply_sets({"train": {"epochs": 2}},
                             ["train.epochs=3", "model.hidden=[32, 16]", "train.sgd.lr=0.1",
                              "data.dir=null", "train.rts=true", "train.replicas=4",
                              "train.adam.eps=1e-8"]))
    assert (cfg.train.epochs, cfg.model.hidden, cfg.train.sgd.lr, cfg.train.rts) == \
        (3, [32, 16], 0.1, True)
    assert cfg.train.adam.eps == 1e-8
    assert cfg.micro_batch == 64 // 4
    assert resolve({"train": {"sgd": {"lr": 1}}}).train.sgd.lr == 1.0     # int -> float


def test_fingerprint_follows_the_resolved_values():
    assert fingerprint(resolve({})) == fingerprint(resolve({"train": {"epochs": 1}}))
    assert fingerprint(resolve({})) != fingerprint(resolve({"train": {"epochs": 2}}))


def test_built_in_configs_are_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config("configs/mnist.yaml") == BUILTIN_CONFIGS / "mnist.yaml"
    assert find_config("mnist") == BUILTIN_CONFIGS / "mnist.yaml"
    own = tmp_path / "configs" / "mnist.yaml"
    own.parent.mkdir()
    own.write_text("seed: 1\n")
    assert find_config("configs/mnist.yaml") == Path("configs/mnist.yaml")   # a path first


@pytest.mark.parametrize("data, message", [
    ({"trian": {}}, "unknown key 'trian'; did you mean 'train'?"),
    ({"train": {"epoch": 2}}, "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    ({"train": {"zzz": 2}}, "unknown key 'train.zzz'; known keys: train.accumulation, "),
    ({"train": 3}, "train: expected a mapping of keys, got 3"),
    ({"train": {"epochs": "two"}}, "train.epochs: expected int, got 'two'"),
    ({"train": {"epochs": 2.5}}, "train.epochs: expected int, got 2.5"),
    ({"train": {"rts": 1}}, "train.rts: expected bool, got 1"),
    ({"train": {"replicas": True}}, "train.replicas: expected int, got True"),
    ({"train": {"epochs": 0}}, "train.epochs: must be >= 1, got 0"),
    ({"model": {"hidden": [64, "x"]}}, "model.hidden: expected list of ints"),
    ({"model": {"hidden": [64, 0]}}, "model.hidden: must be >= 1"),
    ({"model": {"activation": "tanh"}}, "model.activation: must be one of gelu, relu"),
    ({"train": {"optimizer": "lamb"}}, "train.optimizer: must be one of sgd, adam"),
    ({"train": {"global_batch": 60, "replicas": 4, "accumulation": 2}},
     "train.global_batch 60 is not divisible by train.replicas x train.accumulation = 4 x 2 "
     "= 8"),
    ({"test": {"batch_size": 999}}, "test.batch_size 999 is not divisible by train.replicas"),
    ({"train": {"loss_scaling": 0}}, "train.loss_scaling: must be > 0"),
    ({"train": {"rts": True, "replicas": 1, "global_batch": 64}, "test": {"batch_size": 10}},
     "train.rts needs train.replicas >= 2"),
    ({"data": {"source": "idx"}}, "data.source 'idx' needs data.dir"),
    ({"data": {"source": "packaged", "dir": "/x"}}, "data.dir is set"),
])
def test_invalid_configs(data, message):
    with pytest.raises(ConfigError) as info:
        resolve(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("sets, message", [
    (["train.epochs"], "--set 'train.epochs': expected key.path=value"),
    (["=3"], "expected key.path=value"),
    (["train..epochs=3"], "expected key.path=value"),
    (["train.epoch=3"], "--set: unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    (["train=3"], "--set: 'train' is a section"),
    (["seed.x=3"], "--set: 'seed' is not a section"),
    (["train.epochs=[1"], "the value is not valid YAML"),
])
def test_invalid_sets(sets, message):
    with pytest.raises(ConfigError) as info:
        apply_sets({}, sets)
    assert message in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("train: [1, 2\n", "malformed YAML (line"),
    ("- 1\n- 2\n", "a config is a mapping of keys, got list"),
])
def test_malformed_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(str(path))
    with pytest.raises(ConfigError, match="no such config file: .*built-in configs: "):
        load_config(str(tmp_path / "missing.yaml"))
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load_config(str(empty))[1] == {}


def test_worker_placement():
    cfg = resolve({"train": {"replicas": 4}})
    check_workers(cfg, "local", 2)
    with pytest.raises(ConfigError, match="train.replicas 4 is not divisible by --workers 3"):
        check_workers(cfg, "local", 3)
    big = resolve({"train": {"replicas": 64}, "test": {"batch_size": 640}})
    for backend in ("local", "mpi", "ray"):  # more processes than CPUs: allowed, as for
        check_workers(big, backend, 64)      # scripts (the launcher prints a note)
