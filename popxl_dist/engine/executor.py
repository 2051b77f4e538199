"""The executor: a Worker owns a block of replicas (their device memory) and runs a Program on them.

A worker is the only place its replicas' variables (and later remote buffers and RTS shards) live
while a Session is attached. Backends place workers: in the calling process (`local`), on MPI
ranks or Ray actors; the protocol is `weights_from_host`, `run`, `weights_to_host`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._ir.records import IrData
from ..errors import EngineError, RunAborted, WorkerError
from .comm import Communicator, Layout
from .compile import CollectiveStep, Program, explain_error

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
    """Runs the compiled program on the replicas its communicator holds (a contiguous block).

    Without collectives each replica runs the graph in turn. Graphs with collectives compile to
    generators and the replicas run in lockstep: each runs up to its next collective, then the
    communicator combines every local replica's inputs (and other workers') in one step.
    """

    def __init__(self, ir: IrData, comm: Optional[Communicator] = None):
        self.ir = ir
        self.program = Program(ir)
        self.comm = comm or Communicator(Layout(ir.replication_factor, 1), 0)
        self.replicas = list(self.comm.replicas)
        p = self.program
        self.ctxs = [ReplicaContext(r, len(p.state_ids), len(p.h2d_streams), len(p.d2h_streams))
                     for r in self.replicas]
        self._single = len(self.ctxs) == 1

    # --- weights -----------------------------------------------------------------------
    def write_weights(self, values: Dict[str, np.ndarray]) -> None:
        """Copy host values (upstream's host layout: `(G, *shape)` for G > 1 groups, or
        `(R, *shape)` for `all_replicas` variables) into the replicas' variables."""
        idx = self.program.state_index
        main = self.ir.main
        n_replicas = self.ir.replication_factor
        for tid, host in values.items():
            info = main.tensors[tid]
            rg, groups = group_layout(info, n_replicas)
            # `all_replicas` host buffers (after a weights_to_host) hold one value per replica.
            per_replica = (info.extra.get("retrieval_mode") == "all_replicas"
                           and (rg is None or rg.group_size > 1)
                           and host.shape == (n_replicas, *info.shape))
            for ctx in self.ctxs:
                if per_replica:
                    src = host[ctx.replica]
                else:
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

    def read_replicas(self, wanted: Dict[str, Sequence[int]]) -> Dict[str, Dict[int, np.ndarray]]:
        """`{tid: {replica: value}}` for the (local, global-index) replicas asked for (copies)."""
        idx = self.program.state_index
        first = self.replicas[0]
        return {t: {r: self.ctxs[r - first].state[idx[t]].copy() for r in rs}
                for t, rs in wanted.items()}

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
        if cg.has_collectives:
            self._lockstep(cg)
            return
        for ctx in self.ctxs:
            try:
                cg.run(ctx)
            except Exception as e:  # noqa: BLE001 - re-raised naming the replica and op
                err = self._explain(e, ctx.replica)
                if err is e:
                    raise
                raise err from e

    def _explain(self, exc: BaseException, replica: int) -> BaseException:
        """An EngineError naming the op (and the replica when there are several)."""
        err = explain_error(self.program, exc)
        if self.ir.replication_factor > 1:
            op = getattr(err, "op", None)
            text = str(err) if err is not exc else f"{type(exc).__name__}: {exc}"
            err = EngineError(f"replica {replica}: {text}")
            err.op = op
        if err is not exc:
            err.replica = replica
        return err

    def _lockstep(self, cg) -> None:
        """Run every local replica's generator to its next collective, run the collective for all
        of them at once, and repeat until all finish."""
        gens = [cg.run(ctx) for ctx in self.ctxs]
        sends: List[object] = [None] * len(gens)
        comm = self.comm
        while True:
            steps = []
            for ctx, gen, value in zip(self.ctxs, gens, sends):
                try:
                    steps.append(gen.send(value))
                except StopIteration:
                    steps.append(None)
                except Exception as e:  # noqa: BLE001
                    err = self._explain(e, ctx.replica)
                    if err is e:
                        raise
                    raise err from e
            first = steps[0]
            if first is None and all(s is None for s in steps):
                return
            step: CollectiveStep = first[0] if first is not None else None
            if any(s is None or s[0] is not step for s in steps):
                raise EngineError(self._divergence(steps))
            comm.tag = step.tag
            try:
                sends = step.fn(comm, [s[1] for s in steps])
            except (WorkerError, RunAborted):
                raise                            # another worker's failure, already described
            except Exception as e:  # noqa: BLE001
                err = EngineError(f"{step.op.describe()} failed on replicas "
                                  f"{self.replicas[0]}..{self.replicas[-1]}: "
                                  f"{type(e).__name__}: {e}")
                err.op = step.op
                raise err from e

    def _divergence(self, steps) -> str:
        where = []
        for ctx, s in zip(self.ctxs, steps):
            where.append(f"replica {ctx.replica}: "
                         + ("finished" if s is None else f"at {s[0].op.describe()}"))
        return ("replicas diverged: they must run the same collectives in the same order ("
                + "; ".join(where) + ")")
