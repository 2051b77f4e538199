"""Replay a recorded run (see `engine/recorder.py`) in this process, on the local backend, with
the same bits: every replica's device memory and host inputs are restored as they were when the
run started, and the run is made again; it raises the error the recorded run raised, or gives
its outputs bitwise (whether it was recorded in one process, on MPI ranks, on Ray actors or in
popdist instances)."""
from __future__ import annotations

import glob
import json
import linecache
import os
import pickle
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

__all__ = ["Bundle", "ReplayResult", "load_bundle", "replay", "save_replay"]


@dataclass
class Bundle:
    """A replay bundle read from its directory."""

    path: str
    ir: object
    run: int
    session: str
    replication_factor: int
    parts: List[dict] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(not p["succeeded"] for p in self.parts)

    @property
    def recorded_error(self) -> Optional[str]:
        """The recorded failure: a worker's own error rather than another's abort."""
        errors = [p for p in self.parts if p.get("error")]
        own = [p for p in errors if not p.get("aborted")]
        return (own or errors)[0]["error"] if errors else None


def load_bundle(path: str) -> Bundle:
    """Read a bundle's program and parts; a ValueError naming what is missing."""
    path = os.path.abspath(path)
    program = os.path.join(path, "program.pkl")
    if not os.path.isfile(program):
        raise ValueError(f"popxl-replay: {path} is not a replay bundle (no program.pkl; bundles "
                         f"are written under POPXL_RECORD's directory as <session>-run<n>)")
    metas = []
    for meta_path in sorted(glob.glob(os.path.join(path, "part-r*-*.json"))):
        with open(meta_path) as f:
            meta = json.load(f)
        meta["arrays"] = meta_path[:-len(".json")] + ".npz"
        metas.append(meta)
    if not metas:
        raise ValueError(f"popxl-replay: bundle {path} has no parts")
    R = metas[0]["replication_factor"]
    have = sorted((m["replicas"][0], m["replicas"][1]) for m in metas)
    covered = [r for lo, hi in have for r in range(lo, hi)]
    if covered != list(range(R)):
        missing = sorted(set(range(R)) - set(covered))
        raise ValueError(f"popxl-replay: bundle {path} lacks the parts of replicas {missing} "
                         f"(their worker did not write them: it died, or its part of the run "
                         f"succeeded in another popdist instance)")
    with open(program, "rb") as f:
        ir = pickle.load(f)
    return Bundle(path, ir, metas[0]["run"], metas[0]["session"], R,
                  sorted(metas, key=lambda m: m["replicas"][0]))


@dataclass
class ReplayResult:
    """What a replay gave: its outputs (`(T, R, *shape)` per d2h stream id) or its error, and
    how they compare with the recording."""

    outputs: Dict[str, np.ndarray]
    error: Optional[BaseException]
    recorded_outputs: Optional[Dict[str, np.ndarray]]

    @property
    def identical(self) -> Optional[bool]:
        """Whether the outputs are bitwise those recorded (None: the recorded run failed)."""
        if self.recorded_outputs is None or self.error is not None:
            return None
        return all(self.outputs[k].tobytes() == self.recorded_outputs[k].tobytes()
                   for k in self.recorded_outputs)


def _make_worker(bundle: Bundle):
    from ..engine.executor import Worker

    os.environ.setdefault("POPXL_REPLICA_THREADS", "1")   # replica order, pdb-friendly
    worker = Worker(bundle.ir)
    ids = worker.program.state_ids
    for meta in bundle.parts:
        lo, hi = meta["replicas"]
        if list(meta["state_ids"]) != list(ids):
            raise ValueError(f"popxl-replay: part of replicas {lo}..{hi - 1} was recorded for "
                             f"another compilation of the program (state {meta['state_ids']} "
                             f"!= {ids})")
        with np.load(meta["arrays"]) as arrays:
            for j, r in enumerate(range(lo, hi)):
                ctx = worker.ctxs[r]
                for k in range(len(ids)):
                    key = f"s{j}_{k}"
                    ctx.state[k] = arrays[key].copy() if key in arrays.files else None
                for b in meta["remote_buffers"]:
                    key = f"m{j}_{b}"
                    if key in arrays.files:
                        ctx.remote[b] = arrays[key].copy()
    worker.runs = bundle.run - 1          # messages name the recorded run's number
    return worker


def _host_arrays(bundle: Bundle, prefix: str, count: int) -> Optional[List[np.ndarray]]:
    """The parts' arrays `<prefix><k>` put together along the replica axis (axis 1)."""
    out = []
    for k in range(count):
        blocks = []
        for meta in bundle.parts:
            with np.load(meta["arrays"]) as arrays:
                key = f"{prefix}{k}"
                if key not in arrays.files:
                    return None
                blocks.append(arrays[key])
        out.append(np.concatenate(blocks, axis=1))
    return out


def _show_generated_source(worker) -> None:
    """Let pdb and tracebacks list the generated code of every compiled graph."""
    for cg in worker.program._by_filename.values():
        lines = cg.source.splitlines(True)
        linecache.cache[cg.filename] = (len(cg.source), None, lines, cg.filename)


def replay(path: str) -> ReplayResult:
    """Run a bundle's run again in this process (see the module doc)."""
    bundle = load_bundle(path)
    worker = _make_worker(bundle)
    _show_generated_source(worker)
    meta = bundle.parts[0]
    inputs = _host_arrays(bundle, "in", len(meta["h2d_streams"]))
    specs = meta["out_specs"]
    R = bundle.replication_factor
    outputs = [np.zeros((shape[0], R, *shape[2:]), np.dtype(dt)) for shape, dt in specs]
    recorded = None
    if not bundle.failed:
        got = _host_arrays(bundle, "out", len(meta["d2h_streams"]))
        if got is not None:
            recorded = dict(zip(meta["d2h_streams"], got))
    error = None
    try:
        worker.run(inputs, outputs)
    except Exception as e:  # noqa: BLE001 - the result of the replay
        error = e
    return ReplayResult(dict(zip(meta["d2h_streams"], outputs)), error, recorded)


def save_replay(session) -> List[str]:
    """Write the bundle of `session`'s latest run (needs `POPXL_RECORD=DIR` when the Session
    was created); returns the bundle directories (one). A popxl-dist extension: a failing run's
    bundle is written without asking."""
    if not session.ir._data.debug.record_dir:
        raise RuntimeError("popxl.debug.save_replay: the Session is not recording (set "
                           "POPXL_RECORD=DIR, or popxl-run --record DIR, before creating it)")
    return session._runtime.save_recording()
