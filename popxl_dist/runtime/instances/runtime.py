"""The runtime of a popdist instance (`Ir(replication="popdist")` with several instances).

Every instance runs the whole script and holds its block `[offset, offset + local)` of the global
replicas in-process (one `Worker`); collectives over global replica groups cross instances through
the instance group's transport, following the same fixed reduction trees as every other backend
(an instance is a worker of the `Layout`), so the bits equal a one-process run.

Host I/O: `run` takes and returns the local replicas only. Weights: every instance passes the whole
host data (it writes its own replicas' part), and reads are collective: each instance contributes
the values its replicas hold and every instance gets the whole arrays (RTS shards gathered across
instances).
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..._ir.records import IrData
from ...engine.comm import Communicator, Layout
from ...engine.executor import Worker
from ..base import InProcessDebugging, Runtime, emit_prints, host_value, needed_replicas
from ..blas import blas_threads
from .join import instance_group

__all__ = ["InstanceRuntime", "program_signature"]


def program_signature(ir: IrData) -> List[Tuple[str, int, str]]:
    """Per graph: (id, op count, digest of op types, ids and output shapes/dtypes). Instances
    must build the same programs for their collectives to meet."""
    sig = []
    for gid, gd in ir.graphs.items():
        h = hashlib.sha1()
        for op in gd.ops:
            outs = [(gd.tensors[o].shape, gd.tensors[o].dtype.name) for o in op.outputs
                    if o in gd.tensors]
            h.update(repr((op.type, op.id, op.called, outs)).encode())
        sig.append((gid, len(gd.ops), h.hexdigest()[:16]))
    return sig


def _check_instances(infos: Sequence[tuple], me: int) -> List[Tuple[int, int]]:
    """The replica blocks of every instance, checked for consistency with instance `me`."""
    offset, local, total, sig = infos[me]
    blocks = []
    for i, (o, n, t, s) in enumerate(infos):
        if t != total:
            raise ValueError(f"popdist instances disagree on the global replication factor: "
                             f"instance {me} has {total}, instance {i} has {t}")
        if s != sig:
            diff = next(((a, b) for a, b in zip(sig, s) if a != b), None)
            what = (f"graph '{diff[0][0] or 'main'}': {diff[0][1]} ops here, {diff[1][1]} ops "
                    f"there" if diff and diff[0][0] == diff[1][0] else
                    f"{len(sig)} graphs here, {len(s)} there")
            raise ValueError(f"popdist instance {i} built a different program than instance "
                             f"{me} ({what}): every instance must build the same Ir")
        blocks.append((o, o + n))
    try:
        Layout(total, len(infos), blocks)
    except ValueError:
        raise ValueError(f"popdist instances must hold contiguous blocks of the {total} "
                         f"replicas in instance order; got {blocks} (check "
                         f"POPDIST_REPLICA_INDEX_OFFSET / POPDIST_NUM_LOCAL_REPLICAS)") from None
    return blocks


class InstanceRuntime(InProcessDebugging, Runtime):
    """This instance's replicas in-process; collectives and weight reads across instances."""

    def __init__(self, ir: IrData):
        super().__init__(ir)
        placement = ir.instance
        self.placement = placement
        self.group = instance_group(placement)
        self.name = f"{self.group.name} (popdist instance {placement.index} of " \
                    f"{placement.num_instances})"
        infos = self.group.allgather((placement.offset, placement.local, placement.total,
                                      program_signature(ir)))
        blocks = _check_instances(infos, placement.index)
        self.layout = Layout(placement.total, placement.num_instances, blocks)
        self.num_workers = placement.num_instances
        comm = Communicator(self.layout, placement.index, self.group.transport)
        self.worker = Worker(ir, comm)
        self.h2d_streams = self.worker.program.h2d_streams
        self.d2h_streams = self.worker.program.d2h_streams

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self.group.next_run()
        try:
            with blas_threads():
                self.worker.run(inputs, outputs)
        finally:                      # this instance's replicas' print_tensor lines
            emit_prints(self.worker.take_prints())

    def run_fragment(self, which: str) -> None:
        if getattr(self.worker.program, which).has_collectives:
            self.group.next_run()     # (a fragment without collectives is this instance's own)
        try:
            with blas_threads():
                self.worker.run_fragment(which)
        finally:
            emit_prints(self.worker.take_prints())

    def read_variables(self, tids: Sequence[str]) -> Dict[str, np.ndarray]:
        lo, hi = self.layout.blocks[self.placement.index]
        wanted = {t: [r for r in needed_replicas(self.ir, t) if lo <= r < hi] for t in tids}
        parts = self.group.allgather(self.worker.read_replicas(wanted))
        out = {}
        for t in tids:
            per_replica: List[Optional[np.ndarray]] = [None] * self.ir.replication_factor
            for part in parts:
                for r, v in part[t].items():
                    per_replica[r] = v
            out[t] = host_value(self.ir, t, per_replica)
        return out

    def write_variables(self, values: Dict[str, np.ndarray]) -> None:
        self.worker.write_weights(values)

    def blocks(self) -> List[Tuple[int, int]]:
        return list(self.layout.blocks)

    def shares_workers_with(self, other: Runtime) -> bool:
        # Two popdist Sessions of one instance hold the same replica block in this process.
        return isinstance(other, InstanceRuntime) and other.layout.blocks == self.layout.blocks

    def copy_to(self, other: Runtime, plans: Sequence[list]) -> None:
        self.worker.copy_to(other.worker, plans[self.placement.index])

    def memory_report(self) -> List[Dict[str, int]]:
        return [self.worker.memory_report()]
