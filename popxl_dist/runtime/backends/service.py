"""The worker side of every backend: the sessions a worker serves, each a `Worker` over the
worker's block of replicas. MPI ranks, Ray actors and local threads all answer the same
commands through `WorkerService.handle(cmd, sid, run_id, payload)`."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from ...engine.comm import Communicator, Layout, Transport
from ...engine.executor import Worker
from ..base import Printed
from ..blas import blas_threads

__all__ = ["WorkerService"]


class WorkerService:
    """Sessions by id on one worker (index `index` of the pool)."""

    def __init__(self, index: int, transport: Optional[Transport] = None,
                 on_run: Optional[Callable[[int], None]] = None):
        self.index = index
        self.transport = transport
        self._on_run = on_run                  # told each run id before the run starts
        self.sessions: Dict[int, Optional[Worker]] = {}

    def handle(self, cmd: str, sid: int, run_id: int, payload: Any) -> Any:
        if cmd == "open":
            ir, layout = payload
            return self.open(sid, ir, layout)
        if cmd == "close":
            self.sessions.pop(sid, None)
            return None
        worker = self.sessions.get(sid)
        if worker is None:
            if sid not in self.sessions:
                raise RuntimeError(f"worker {self.index}: no session {sid}")
            return None                        # this worker holds no replicas of the session
        if cmd in ("run", "run_fragment") and self._on_run is not None:
            self._on_run(run_id)
        if cmd == "run":
            inputs, out_specs = payload
            outputs = [np.empty(shape, dtype) for shape, dtype in out_specs]
            with blas_threads():
                worker.run(inputs, outputs)
            return self._with_prints(worker, outputs)
        if cmd == "run_fragment":
            with blas_threads():
                worker.run_fragment(payload)
            return self._with_prints(worker, None)
        if cmd == "read":
            return worker.read_replicas(payload)
        if cmd == "write":
            worker.write_weights(payload)
            return None
        if cmd == "memory":
            return worker.memory_report()
        if cmd == "set_taps":
            worker.set_taps(payload)
            return None
        if cmd == "take_taps":
            return worker.take_taps()
        if cmd == "save_recording":
            return worker.save_recording()
        if cmd == "take_profile":
            return worker.take_profile()
        if cmd == "flight":
            return worker.flight.snapshot()
        if cmd == "copy_to":
            dst_sid, plan = payload
            if plan:
                dst = self.sessions.get(dst_sid)
                if dst is None:
                    raise RuntimeError(f"worker {self.index}: copy_to: session {dst_sid} holds "
                                       f"no replicas on this worker")
                worker.copy_to(dst, plan)
            return None
        raise ValueError(f"worker {self.index}: unknown command {cmd!r}")

    @staticmethod
    def _with_prints(worker: Worker, result: Any) -> Any:
        """`result`, wrapped with the run's print_tensor lines when there are any (the host
        prints them)."""
        lines = worker.take_prints()
        return Printed(result, lines) if lines else result

    def open(self, sid: int, ir, layout: Layout) -> None:
        """Compile the session's program for this worker's replicas (none if the layout has
        fewer workers than the pool)."""
        if self.index >= layout.num_workers:
            self.sessions[sid] = None
            return
        self.sessions[sid] = Worker(ir, Communicator(layout, self.index, self.transport))
