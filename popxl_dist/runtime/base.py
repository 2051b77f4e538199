"""The interface a Session drives; each backend implements it."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .._ir.records import IrData, TensorKind

__all__ = ["Runtime", "to_host_layout", "needed_replicas", "host_value", "Printed",
           "emit_prints", "InProcessDebugging"]


class Printed(NamedTuple):
    """A worker's reply to a run that printed (`ops.print_tensor`): its result and the lines."""

    result: Any
    lines: List[str]


def emit_prints(lines: Sequence[str]) -> None:
    """Write PrintTensor output in the host process, to stderr (as upstream's Poplar stream)."""
    if lines:
        sys.stderr.write("".join(lines))
        sys.stderr.flush()


def unwrap_printed(reply: Any) -> Any:
    """A worker reply without its print lines (which are written to stderr here)."""
    if isinstance(reply, Printed):
        emit_prints(reply.lines)
        return reply.result
    return reply


def _members(ir: IrData, rg, r: int) -> List[int]:
    return rg.members(rg.group_of(r)) if rg is not None else list(range(ir.replication_factor))


def needed_replicas(ir: IrData, tid: str) -> List[int]:
    """The replicas whose stored value of variable `tid` makes up its host value (for an RTS
    variable: the shard holders of each group's first block)."""
    info = ir.main.tensors[tid]
    rg = info.extra.get("replica_grouping")
    mode = info.extra.get("retrieval_mode", "one_per_group")
    R = ir.replication_factor
    if mode == "all_replicas" and R > 1:
        return list(range(R))
    firsts = [0] if rg is None else [rg.members(g)[0] for g in range(rg.num_groups)]
    if info.extra.get("sharded"):
        k = info.extra["shard_over"]
        return sorted(m for f in firsts for m in _members(ir, rg, f)[:k])
    return firsts


def host_value(ir: IrData, tid: str, per_replica: List[Optional[np.ndarray]]) -> np.ndarray:
    """The host value of variable `tid` from the stored values read from `needed_replicas`
    (`per_replica[r]`, None where not read): RTS shards are put back together first."""
    from ..engine.executor import unshard

    info = ir.main.tensors[tid]
    if info.extra.get("sharded"):
        rg = info.extra.get("replica_grouping")
        k = info.extra["shard_over"]
        full: List[Optional[np.ndarray]] = [None] * len(per_replica)
        for r in range(len(per_replica)):
            mem = _members(ir, rg, r)
            blk = mem.index(r) // k
            holders = mem[blk * k:(blk + 1) * k]
            if all(per_replica[h] is not None for h in holders):
                full[r] = unshard([per_replica[h] for h in holders], info.shape)
        per_replica = full
    return to_host_layout(ir, tid, per_replica)


def to_host_layout(ir: IrData, tid: str, per_replica: Sequence[np.ndarray]) -> np.ndarray:
    """Combine one variable's per-replica values (all replicas, in order) into upstream's host
    layout: one value per group (first member), or every replica for `all_replicas`."""
    info = ir.main.tensors[tid]
    rg = info.extra.get("replica_grouping")
    mode = info.extra.get("retrieval_mode", "one_per_group")
    if rg is None or (rg.num_groups == 1 and not (mode == "all_replicas" and rg.group_size > 1)):
        if mode == "all_replicas" and ir.replication_factor > 1:
            return np.stack(per_replica)
        return per_replica[0]
    if mode == "all_replicas" and rg.group_size > 1:
        return np.stack(per_replica)
    return np.stack([per_replica[rg.members(g)[0]] for g in range(rg.num_groups)])


class Runtime:
    """Places replicas on workers and forwards the Session's requests to them."""

    name = "base"
    num_workers = 1

    def __init__(self, ir: IrData):
        self.ir = ir
        self.variables: List[str] = [t for t, i in ir.main.tensors.items()
                                     if i.kind == TensorKind.VARIABLE]

    h2d_streams: List[str]
    d2h_streams: List[str]

    def attach(self) -> None:
        pass

    def detach(self) -> None:
        pass

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        raise NotImplementedError

    def run_fragment(self, which: str) -> None:
        raise NotImplementedError

    def read_variables(self, tids: Sequence[str]) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def write_variables(self, values: Dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def blocks(self) -> List[Tuple[int, int]]:
        """The replica block `(lo, hi)` of each worker, in worker order."""
        return [(0, self.ir.replication_factor)]

    def shares_workers_with(self, other: "Runtime") -> bool:
        """Whether `other`'s replicas live on this runtime's workers (worker w of both is the
        same worker), so `copy_to` can copy between them there."""
        return False

    def copy_to(self, other: "Runtime", plans: Sequence[list]) -> None:
        """Copy variables into `other` on the workers (`plans[w]` for worker w, made by
        `runtime.backends.copy.plan_copy`); only when `shares_workers_with(other)`."""
        raise NotImplementedError(f"the {self.name} runtime cannot copy variables on its "
                                  f"workers")

    def close(self) -> None:
        """Free the workers' copy of this program (called when the Session is collected)."""

    def memory_report(self) -> List[Dict[str, int]]:
        """Device bytes by kind of the first replica of each worker."""
        raise NotImplementedError

    # --- debugging (popxl.debug) ---------------------------------------------------------
    def set_taps(self, taps: Optional[Dict[str, List[str]]]) -> None:
        """Keep these tensors' values (`{graph id: tensor ids}`) in every run from now on, or
        stop (None)."""
        raise NotImplementedError(f"the {self.name} runtime cannot keep tensors")

    def take_taps(self) -> Dict[int, list]:
        """`{replica: [(graph id, tensor id, call sites, value), ...]}` of the last run, for
        the replicas this process feeds."""
        raise NotImplementedError(f"the {self.name} runtime cannot keep tensors")

    def save_recording(self) -> List[str]:
        """Every worker writes its part of the latest run's replay bundle (POPXL_RECORD);
        the bundles' directories."""
        raise NotImplementedError(f"the {self.name} runtime cannot record runs")

    def take_profile(self) -> List[dict]:
        """Every worker's profiler records since the last call (POPXL_PROFILE), in worker
        order (see `engine/profiler.py`)."""
        raise NotImplementedError(f"the {self.name} runtime cannot profile")


class InProcessDebugging:
    """The debugging requests of a runtime whose replicas all live in `self.worker` (an
    executor Worker in this process)."""

    worker: Any

    def set_taps(self, taps) -> None:
        self.worker.set_taps(taps)

    def take_taps(self) -> Dict[int, list]:
        return self.worker.take_taps()

    def save_recording(self) -> List[str]:
        path = self.worker.save_recording()
        return [path] if path else []

    def take_profile(self) -> List[dict]:
        part = self.worker.take_profile()
        return [part] if part else []
