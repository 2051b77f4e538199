"""The executor: a Worker owns a block of replicas (their device memory) and runs a Program on them.

A worker is the only place its replicas' variables (and later remote buffers and RTS shards) live
while a Session is attached. Backends place workers: in the calling process (`local`), on MPI
ranks or Ray actors; the protocol is `weights_from_host`, `run`, `weights_to_host`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._ir.records import IrData
from .compile import Program, explain_error

__all__ = ["ReplicaContext", "Worker", "group_layout"]


class ReplicaContext:
    """One replica's device memory and its host-stream cursors for the current run."""

    __slots__ = ("replica", "state", "in_chunks", "in_count", "out_chunks", "out_count",
                 "remote")

    def __init__(self, replica: int, n_state: int, n_in: int, n_out: int):
        self.replica = replica
        self.state: List[Optional[np.ndarray]] = [None] * n_state
        self.in_chunks: List[Sequence[np.ndarray]] = [()] * n_in
        self.in_count = [0] * n_in
        self.out_chunks: List[Sequence[np.ndarray]] = [()] * n_out
        self.out_count = [0] * n_out
        self.remote: Dict[int, np.ndarray] = {}

    def next_input(self, slot: int) -> np.ndarray:
        k = self.in_count[slot]
        self.in_count[slot] = k + 1
        chunks = self.in_chunks[slot]
        return chunks[k % len(chunks)]

    def store_output(self, slot: int, value: np.ndarray) -> None:
        k = self.out_count[slot]
        self.out_count[slot] = k + 1
        chunks = self.out_chunks[slot]
        chunks[k % len(chunks)][...] = value


def group_layout(info, replication_factor: int) -> Tuple[object, int]:
    """(grouping, number of groups) of a variable TensorInfo."""
    rg = info.extra.get("replica_grouping")
    if rg is None:
        return None, 1
    return rg, rg.num_groups


class Worker:
    """Runs the compiled program on replicas `replicas` (global indices, contiguous)."""

    def __init__(self, ir: IrData, replicas: Sequence[int]):
        self.ir = ir
        self.program = Program(ir)
        self.replicas = list(replicas)
        p = self.program
        self.ctxs = [ReplicaContext(r, len(p.state_ids), len(p.h2d_streams), len(p.d2h_streams))
                     for r in self.replicas]
        self._single = len(self.ctxs) == 1

    # --- weights -----------------------------------------------------------------------
    def write_weights(self, values: Dict[str, np.ndarray]) -> None:
        """Copy host values (upstream's host layout: `(G, *shape)` for G > 1 groups) into the
        replicas' variables."""
        idx = self.program.state_index
        main = self.ir.main
        for tid, host in values.items():
            info = main.tensors[tid]
            rg, groups = group_layout(info, self.ir.replication_factor)
            for ctx in self.ctxs:
                src = host[rg.group_of(ctx.replica)] if groups > 1 else host
                cur = ctx.state[idx[tid]]
                if cur is None or cur.shape != info.shape:
                    ctx.state[idx[tid]] = np.array(src, dtype=info.dtype.as_numpy(), copy=True)
                else:
                    cur[...] = src

    def read_weights(self, tids: Sequence[str]) -> Dict[str, List[np.ndarray]]:
        """Each variable's value on each local replica (copies)."""
        idx = self.program.state_index
        return {t: [ctx.state[idx[t]].copy() for ctx in self.ctxs] for t in tids}

    def run_fragment(self, which: str) -> None:
        cg = getattr(self.program, which)
        if cg.ops:
            self._execute(cg)

    # --- run ---------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run the main program once. `inputs[s]` / `outputs[s]` are `(T, R_local, *shape)`
        arrays for stream slot s."""
        for j, ctx in enumerate(self.ctxs):
            for s, arr in enumerate(inputs):
                chunks = [arr[t, j, ...] for t in range(arr.shape[0])]
                for c in chunks:
                    c.flags.writeable = False
                ctx.in_chunks[s] = chunks
                ctx.in_count[s] = 0
            for s, arr in enumerate(outputs):
                ctx.out_chunks[s] = [arr[t, j, ...] for t in range(arr.shape[0])]
                ctx.out_count[s] = 0
        self._execute(self.program.main)

    def _execute(self, cg) -> None:
        try:
            if self._single:
                cg.run(self.ctxs[0])
            elif cg.has_collectives:
                raise NotImplementedError(
                    "Collectives across replicas are not implemented yet (replication issue)")
            else:
                for ctx in self.ctxs:
                    cg.run(ctx)
        except Exception as e:  # noqa: BLE001 - re-raised naming the op that failed
            err = explain_error(self.program, e)
            if err is e:
                raise
            raise err from e
