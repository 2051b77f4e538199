"""Recording for replay (`POPXL_RECORD=DIR`): each worker keeps what its replicas need to run
the latest run again (device memory at the run's start: variables, RTS shards and remote
buffers; the run's host inputs; its outputs once it succeeded) and writes it, as its part of a
replay bundle, when the run fails or when the host asks (`popxl.debug.save_replay`).

A bundle is a directory `DIR/<session>-run<n>/`: `program.pkl` (the Ir, pickled), and per
worker `part-r<lo>-<hi>.npz` (its replicas' arrays) with `part-r<lo>-<hi>.json` (what the
arrays are, whether the run failed and how). `popxl-replay` (popxl_dist/debug/replay.py) runs
it again in one process.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["Recorder", "bundle_dir", "BUNDLE_FORMAT"]

BUNDLE_FORMAT = 1


def bundle_dir(root: str, session_tag: str, run: int) -> str:
    return os.path.join(root, f"{session_tag}-run{run}")


def _atomic_write(path: str, write) -> None:
    """Write a file through a temporary name in its directory, then rename it into place
    (workers of one bundle may write the shared files at the same time)."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Recorder:
    """One worker's record of its latest run."""

    def __init__(self, root: str, session_tag: str):
        self.root = root
        self.session_tag = session_tag
        self.run = 0
        self.state: List[List[Optional[np.ndarray]]] = []
        self.remote: List[Dict[int, np.ndarray]] = []
        self.inputs: List[np.ndarray] = []
        self.outputs: Optional[List[np.ndarray]] = None
        self.out_specs: List[list] = []
        self.saved_run = 0

    def start(self, worker, run: int, inputs: Sequence[np.ndarray]) -> None:
        """Copy the device memory of `worker`'s replicas and the run's inputs."""
        self.run = run
        self.state = [[None if a is None else a.copy() for a in ctx.state] for ctx in worker.ctxs]
        self.remote = [{b: a.copy() for b, a in ctx.remote.items()} for ctx in worker.ctxs]
        self.inputs = [np.array(a, copy=True) for a in inputs]
        self.outputs = None

    def expect_outputs(self, outputs: Sequence[np.ndarray]) -> None:
        """The shapes and dtypes of the run's output arrays (replay allocates them)."""
        self.out_specs = [[list(a.shape), a.dtype.str] for a in outputs]

    def succeeded(self, outputs: Sequence[np.ndarray]) -> None:
        self.outputs = [np.array(a, copy=True) for a in outputs]

    def save(self, worker, error: Optional[BaseException] = None) -> Optional[str]:
        """Write this worker's part of the latest run's bundle (once); returns the bundle's
        directory, or None when there is no run to save."""
        if not self.run:
            return None
        path = bundle_dir(self.root, self.session_tag, self.run)
        if self.saved_run == self.run:
            return path
        os.makedirs(path, exist_ok=True)
        lo, hi = worker.replicas[0], worker.replicas[-1] + 1
        program = os.path.join(path, "program.pkl")
        if not os.path.exists(program):
            ir = worker.ir
            debug = ir.debug
            ir.debug = debug.with_(record_dir=None, flight_dir=None)
            try:
                blob = pickle.dumps(ir, protocol=pickle.HIGHEST_PROTOCOL)
            finally:
                ir.debug = debug
            _atomic_write(program, lambda f: f.write(blob))
        arrays: Dict[str, np.ndarray] = {}
        for j, (state, remote) in enumerate(zip(self.state, self.remote)):
            for k, a in enumerate(state):
                if a is not None:
                    arrays[f"s{j}_{k}"] = a
            for b, a in remote.items():
                arrays[f"m{j}_{b}"] = a
        for k, a in enumerate(self.inputs):
            arrays[f"in{k}"] = a
        for k, a in enumerate(self.outputs or ()):
            arrays[f"out{k}"] = a
        p = worker.program
        meta = {
            "format": BUNDLE_FORMAT, "session": self.session_tag, "run": self.run,
            "replication_factor": worker.ir.replication_factor, "replicas": [lo, hi],
            "worker": worker.comm.worker, "state_ids": list(p.state_ids),
            "h2d_streams": list(p.h2d_streams), "d2h_streams": list(p.d2h_streams),
            "remote_buffers": sorted(int(b) for b in worker.ir.remote_buffers),
            "out_specs": self.out_specs,
            "succeeded": self.outputs is not None,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            # stopped because another worker failed: not where the run went wrong
            "aborted": error is not None and type(error).__name__ == "RunAborted",
        }
        base = os.path.join(path, f"part-r{lo}-{hi}")
        _atomic_write(base + ".npz", lambda f: np.savez(f, **arrays))
        _atomic_write(base + ".json", lambda f: f.write(json.dumps(meta, indent=1).encode()))
        self.saved_run = self.run
        return path
