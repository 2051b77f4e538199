"""The `local` backend with one worker: every replica in the calling thread (the debug mode: pdb
works). With POPXL_WORKERS > 1 the local backend uses worker threads instead (`threads.py`)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from ..._ir.records import IrData
from ...engine.executor import Worker
from ..base import InProcessDebugging, Runtime, emit_prints, host_value, needed_replicas
from ..blas import blas_threads

__all__ = ["LocalRuntime"]


class LocalRuntime(InProcessDebugging, Runtime):
    name = "local"

    def __init__(self, ir: IrData):
        super().__init__(ir)
        self.num_workers = 1
        self.worker = Worker(ir)
        self.h2d_streams = self.worker.program.h2d_streams
        self.d2h_streams = self.worker.program.d2h_streams

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        try:
            with blas_threads():
                self.worker.run(inputs, outputs)
        finally:                      # lines printed before a failure help to debug it
            emit_prints(self.worker.take_prints())

    def run_fragment(self, which: str) -> None:
        try:
            with blas_threads():
                self.worker.run_fragment(which)
        finally:
            emit_prints(self.worker.take_prints())

    def read_variables(self, tids: Sequence[str]) -> Dict[str, np.ndarray]:
        wanted = {t: needed_replicas(self.ir, t) for t in tids}
        got = self.worker.read_replicas(wanted)
        out = {}
        for t, by_r in got.items():
            per_replica: List[Optional[np.ndarray]] = [None] * self.ir.replication_factor
            for r, v in by_r.items():
                per_replica[r] = v
            out[t] = host_value(self.ir, t, per_replica)
        return out

    def shares_workers_with(self, other: Runtime) -> bool:
        return isinstance(other, LocalRuntime)       # both in this process

    def copy_to(self, other: Runtime, plans: Sequence[list]) -> None:
        self.worker.copy_to(other.worker, plans[0])

    def memory_report(self) -> List[Dict[str, int]]:
        return [self.worker.memory_report()]

    def write_variables(self, values: Dict[str, np.ndarray]) -> None:
        self.worker.write_weights(values)
