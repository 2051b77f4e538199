"""`TaskSession`: a popxl Session that knows its streams and named state, and saves / loads
checkpoints in upstream's on-disk layout.

A checkpoint directory holds:

    model/<flat key>.npz     one array per state tensor, stored under the key `<flat key>`
    model/<flat key>.npy     instead, for a memmap-backed variable: a copy of its memmap file
    dataloader.bin           written by `dataloader.save(path)` when a dataloader is set
    session_info.json        `session_state` (at least {"steps": N})

Only popdist instance 0 writes (every instance reads the weights, which is collective across
instances). `wandb://` destinations need Weights & Biases and the network: not supported here.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings
import zipfile
import zlib
from collections import deque
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Union

import numpy as np

import popdist
import popxl

from .named_tensors import NamedTensorData, NamedTensors
from .streams import InputStreams, OutputStreams

__all__ = ["TaskSession", "write_variables_pb", "initialise_memmap_dir_from_checkpoint",
           "ReportMissingMethods"]

ReportMissingMethods = Literal["none", "warn", "error"]
_REPORT = ("none", "warn", "error")
_log = logging.getLogger("popxl_addons")
_NO_WANDB = ("{what}: Weights & Biases (wandb) is not supported by popxl-dist (it needs the "
             "wandb package and network access); save to a local directory instead")


def _memmap_of(var: popxl.Variable) -> Optional[np.memmap]:
    """The memmap backing `var`, if any (`Variable._memmap_arr`, or memmap initial data)."""
    mm = getattr(var, "_memmap_arr", None)
    if isinstance(mm, np.memmap):
        return mm
    info = getattr(var, "_info", None)
    data = info.data if info is not None else None
    return data if isinstance(data, np.memmap) else None


def _report(missing: Mapping[str, Iterable[str]], mode: str, what: str) -> None:
    if mode not in _REPORT:
        raise ValueError(f"{what}: report_missing must be one of {_REPORT}, got {mode!r}")
    lines = [f"{side}: {sorted(keys)}" for side, keys in missing.items() if keys]
    if not lines or mode == "none":
        return
    text = f"{what}: keys missing. " + "; ".join(lines)
    if mode == "error":
        raise ValueError(text)
    warnings.warn(text, stacklevel=3)


def _instance0() -> bool:
    return popdist.getInstanceIndex() == 0


def _check_local(path: str, what: str) -> str:
    path = os.fspath(path)
    if path.startswith("wandb://"):
        raise NotImplementedError(_NO_WANDB.format(what=what))
    return path


class TaskSession(popxl.Session):
    """A `popxl.Session` with its input / output streams, its named state and checkpoints.

    Args:
        inputs: `InputStreams`, or an iterable of host-to-device streams.
        outputs: `OutputStreams`, or an iterable of device-to-host streams.
        state: the named tensors (variables) that make up the model and optimiser state; what
            checkpoints hold.
        max_checkpoints: directories `save_checkpoint` keeps (the oldest is deleted).
        *args, **kwargs: `popxl.Session(ir, device_desc, ...)`.

    Example:
        >>> session = TaskSession(inputs, outputs, variables, ir=ir, device_desc="ipu_hw")
        >>> with session:
        ...     session.run({inputs.x: data})
        ...     session.save_checkpoint("ckpt/step_1")
    """

    def __init__(self, inputs: Union[InputStreams, Iterable[popxl.HostToDeviceStream]],
                 outputs: Union[OutputStreams, Iterable[popxl.DeviceToHostStream]],
                 state: NamedTensors, max_checkpoints: int = 1, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(inputs, InputStreams):
            inputs = InputStreams.from_streams(inputs)
        if not isinstance(outputs, OutputStreams):
            outputs = OutputStreams.from_streams(outputs)
        if not isinstance(state, NamedTensors):
            raise TypeError(f"TaskSession: `state` must be NamedTensors, got "
                            f"{type(state).__name__}")
        if not isinstance(max_checkpoints, int) or max_checkpoints < 1:
            raise ValueError(f"TaskSession: max_checkpoints must be an int >= 1, got "
                             f"{max_checkpoints!r}")
        self.inputs = inputs
        self.outputs = outputs
        self.state = state
        self.max_checkpoints = max_checkpoints
        self.session_state: Dict[str, Any] = {"steps": 0}
        self._dataloader = None
        self._checkpoints: deque = deque()

    # --- dataloader and state -----------------------------------------------------------
    @property
    def dataloader(self):
        """An object with `save(path)` and `resume(path)` methods, saved with checkpoints."""
        return self._dataloader

    @dataloader.setter
    def dataloader(self, dataloader) -> None:
        if dataloader is not None and not all(
                callable(getattr(dataloader, m, None)) for m in ("save", "resume")):
            raise ValueError(f"TaskSession.dataloader: the dataloader must have `save` and "
                             f"`resume` methods, {type(dataloader).__name__} has not")
        self._dataloader = dataloader

    def add_session_state_info(self, info: Dict[str, Any]) -> None:
        """Add entries to `session_state` (saved in session_info.json)."""
        if not isinstance(info, dict):
            raise TypeError(f"add_session_state_info: expected a dict, got "
                            f"{type(info).__name__}")
        self.session_state.update(info)

    def get_named_tensors_data(self) -> NamedTensorData:
        """The host data of every state tensor, by key (memmap-backed ones as their memmap)."""
        keys, tensors = self.state.unpack()
        data = self.get_tensors_data(tensors)
        return NamedTensorData.pack(keys, [data[t] for t in tensors])

    def run(self, inputs=None, downcast_inputs: bool = True):
        """`Session.run`, counting `session_state["steps"]`."""
        out = super().run(inputs, downcast_inputs)
        self.session_state["steps"] += 1
        return out

    def load_from_session(self, src: "TaskSession",
                          report_missing: ReportMissingMethods = "none") -> None:
        """Copy the state tensors that `src` has under the same keys into this session (with
        `Session.copy_weights_to`, so on the workers when both sessions share them)."""
        if not isinstance(src, TaskSession):
            raise TypeError(f"load_from_session: `src` must be a TaskSession, got "
                            f"{type(src).__name__}")
        mine, theirs = self.state.to_dict(), src.state.to_dict()
        _report({"not in the source": mine.keys() - theirs.keys(),
                 "not in this session": theirs.keys() - mine.keys()}, report_missing,
                "load_from_session")
        src.copy_weights_to(self, {theirs[k]: mine[k] for k in mine if k in theirs})

    # --- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write the state, dataloader and session state to `checkpoint_dir` (instance 0 only)
        and delete the oldest checkpoint beyond `max_checkpoints`."""
        checkpoint_dir = _check_local(checkpoint_dir, "save_checkpoint")
        named = self.get_named_tensors_data().to_dict()      # every instance: collective
        if _instance0():
            self._write_checkpoint(checkpoint_dir, named)
        # popxl-dist: every instance returns once the checkpoint is whole, so any of them may
        # load it next (upstream returns at once on the instances that do not write).
        popdist.barrier()

    def _write_checkpoint(self, checkpoint_dir: str, named: Dict[str, np.ndarray]) -> None:
        model_dir = os.path.join(checkpoint_dir, "model")
        with _naming(model_dir):
            os.makedirs(model_dir, exist_ok=True)
        state = self.state.to_dict()
        for key, data in named.items():
            mm = _memmap_of(state[key])
            if mm is not None:
                mm.flush()
                path = os.path.join(model_dir, f"{key}.npy")
                with _naming(path):
                    shutil.copyfile(mm.filename, path)
            else:
                path = os.path.join(model_dir, f"{key}.npz")
                with _naming(path):
                    np.savez(path, **{key: np.asarray(data)})
        if self._dataloader is not None:
            path = os.path.join(checkpoint_dir, "dataloader.bin")
            with _naming(path):
                self._dataloader.save(path)
        # Written last: a directory with a readable session_info.json is a whole checkpoint.
        path = os.path.join(checkpoint_dir, "session_info.json")
        with _naming(path), open(path, "w") as f:
            json.dump(self.session_state, f)
        _log.info("Saved checkpoint %s", checkpoint_dir)
        self._keep_latest(checkpoint_dir)

    def _keep_latest(self, checkpoint_dir: str) -> None:
        path = os.path.abspath(checkpoint_dir)
        if path in self._checkpoints:
            self._checkpoints.remove(path)
        self._checkpoints.append(path)
        while len(self._checkpoints) > self.max_checkpoints:
            shutil.rmtree(self._checkpoints.popleft(), ignore_errors=True)

    def load_checkpoint(self, checkpoint_dir: str,
                        report_missing: ReportMissingMethods = "warn",
                        skip_memmap: bool = False) -> None:
        """Load a checkpoint written by `save_checkpoint`: the state tensors found in
        `model/` (keys missing on either side are reported), the dataloader position and
        `session_state` ({"steps": 0} if session_info.json is missing).

        Args:
            checkpoint_dir: the directory.
            report_missing: "warn", "none" or "error" (`ValueError`).
            skip_memmap: leave memmap-backed variables as they are.
        """
        checkpoint_dir = _check_local(checkpoint_dir, "load_checkpoint")
        model_dir = os.path.join(checkpoint_dir, "model")
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"load_checkpoint: {checkpoint_dir} is not a checkpoint "
                                    f"(no model/ directory)")
        files = {}
        for name in sorted(os.listdir(model_dir)):
            key, ext = os.path.splitext(name)
            if ext in (".npz", ".npy"):
                files[key] = os.path.join(model_dir, name)
        state = self.state.to_dict()
        _report({"not in the checkpoint": state.keys() - files.keys(),
                 "not in the session": files.keys() - state.keys()}, report_missing,
                "load_checkpoint")
        # popxl-dist: every file is read (and an unreadable one named) before anything is
        # loaded, so a corrupt checkpoint leaves the session as it was.
        info = os.path.join(checkpoint_dir, "session_info.json")
        session_state = {"steps": 0}
        if os.path.exists(info):
            with _reading(info), open(info) as f:
                session_state = json.load(f)
            if not isinstance(session_state, dict):
                raise ValueError(f"load_checkpoint: {info} is unreadable (it holds a JSON "
                                 f"{_json_kind(session_state)}, not the object of session state "
                                 f"save_checkpoint writes, e.g. {{\"steps\": 10}})")
        updates = {}
        for key, path in files.items():
            var = state.get(key)
            if var is None:
                continue
            if path.endswith(".npy"):
                if skip_memmap and _memmap_of(var) is not None:
                    continue
                with _reading(path):
                    data = np.fromfile(path, var.dtype.as_numpy()).reshape(var._retrieved_shape)
            else:
                with _reading(path), np.load(path) as f:
                    if key not in f.files:
                        raise ValueError(f"load_checkpoint: {path} holds {f.files}, not the "
                                         f"array '{key}'")
                    data = f[key]
                if data.shape != tuple(var._retrieved_shape):
                    raise ValueError(f"load_checkpoint: {path} holds shape {data.shape}, the "
                                     f"variable '{key}' has {tuple(var._retrieved_shape)} on "
                                     f"the host")
            updates[var] = data
        if self._dataloader is not None:
            path = os.path.join(checkpoint_dir, "dataloader.bin")
            with _reading(path):
                self._dataloader.resume(path)
        self.write_variables_data(updates)
        self.session_state = session_state

    # --- Weights & Biases -----------------------------------------------------------------
    def wandb_histogram(self, name: str, step: int, data) -> None:
        raise NotImplementedError(_NO_WANDB.format(what="wandb_histogram"))

    def wandb_variable_histograms(self, step: int = 0) -> None:
        raise NotImplementedError(_NO_WANDB.format(what="wandb_variable_histograms"))


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type (list -> "array", str -> "string" ...)."""
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


@contextlib.contextmanager
def _naming(path: str):
    """An OSError while writing `path` names it (a full disk's does not by itself)."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror or str(e), path) from e


@contextlib.contextmanager
def _reading(path: str):
    """An error while reading checkpoint file `path` names it (a corrupt `.npz` gives
    `BadZipFile: File is not a zip file`, a truncated `.npy` a reshape error, ...): ValueError,
    or OSError with the file name."""
    try:
        with _naming(path):
            yield
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        if path in str(e):
            raise
        raise ValueError(f"load_checkpoint: {path} is unreadable "
                         f"({type(e).__name__}: {e})") from e


def write_variables_pb(session: popxl.Session, weights: Mapping[popxl.Variable, Any]) -> None:
    """Write host data into variables. Upstream writes through popart's weights IO, skipping
    popxl's host buffers; here it is `session.write_variables_data` (same effect, checked)."""
    session.write_variables_data(dict(weights))


def initialise_memmap_dir_from_checkpoint(checkpoint_dir: str, memmap_dir: str) -> None:
    """Fill `memmap_dir` with one raw `<key>.npy` memmap file per state tensor of a checkpoint
    (memmap copies are copied, `.npz` arrays written raw), so variables created with
    `memmap_dir=memmap_dir` (and `read_only_if_exists=True`) start from it. Instance 0 writes;
    the instances of a popdist run then wait for each other."""
    checkpoint_dir = _check_local(checkpoint_dir, "initialise_memmap_dir_from_checkpoint")
    model_dir = os.path.join(checkpoint_dir, "model")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"initialise_memmap_dir_from_checkpoint: {checkpoint_dir} is "
                                f"not a checkpoint (no model/ directory)")
    if _instance0():
        os.makedirs(memmap_dir, exist_ok=True)
        for name in sorted(os.listdir(model_dir)):
            key, ext = os.path.splitext(name)
            src = os.path.join(model_dir, name)
            dst = os.path.join(memmap_dir, f"{key}.npy")
            if ext == ".npy":
                shutil.copyfile(src, dst)
            elif ext == ".npz":
                with np.load(src) as f:
                    np.ascontiguousarray(f[key]).tofile(dst)
    popdist.barrier()
