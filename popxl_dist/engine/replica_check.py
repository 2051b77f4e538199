"""`POPXL_CHECK_REPLICAS=1`: after each run, every variable that must hold the same value on the
replicas of its group is compared across them (a CRC-32 of each replica's bytes, gathered from
every worker: a difference escapes it with probability 2**-32), and a difference raises
`popxl.errors.ReplicaDivergenceError` naming the variables, the replicas and the run. Every
worker reaches the same verdict from the same checksums. Scratch variables (written only by
stores of data that may differ, e.g. pipeline stashes) are not compared."""
from __future__ import annotations

import zlib
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .._ir.partitions import variable_partition
from .._ir.records import IrData, TensorKind
from ..errors import ReplicaDivergenceError
from .comm import Communicator

__all__ = ["ReplicaCheck"]

_DIGEST = 4
_TAG = 0       # the check's exchange runs alone, after the run's last collective


class ReplicaCheck:
    """The variables to compare and their required partitions, for one program."""

    def __init__(self, ir: IrData):
        R = ir.replication_factor
        scratch = set(ir.debug.scratch_variables)
        self.run_parts: List[Tuple[str, Tuple[int, ...]]] = []
        for t, info in ir.main.tensors.items():
            if info.kind != TensorKind.VARIABLE or t in scratch:
                continue
            part = variable_partition(info, R)
            if part is not None and len(set(part)) < R:
                self.run_parts.append((t, part))

    @staticmethod
    def _digests(values: Sequence[np.ndarray]) -> np.ndarray:
        sums = np.array([zlib.crc32(np.ascontiguousarray(v).view(np.uint8)) for v in values],
                        np.uint32)
        return sums.view(np.uint8)

    def check(self, comm: Communicator, stored_by_replica: Sequence[Sequence[np.ndarray]],
              run: int) -> None:
        """Compare the variables (`stored_by_replica[j]`: local replica j's values, in this
        check's order) across all replicas; raise on a difference."""
        if not self.run_parts:
            return
        mine = [self._digests(vals) for vals in stored_by_replica]
        comm.tag = _TAG
        table = comm.all_gather(mine, 1, comm.replication_factor)[0]    # (R, n * 8)
        bad: Dict[str, List[List[int]]] = {}
        for k, (tid, part) in enumerate(self.run_parts):
            cols = table[:, k * _DIGEST:(k + 1) * _DIGEST]
            blocks: Dict[int, List[int]] = {}
            for r, q in enumerate(part):
                blocks.setdefault(q, []).append(r)
            for members in blocks.values():
                agree: Dict[bytes, List[int]] = {}
                for r in members:
                    agree.setdefault(cols[r].tobytes(), []).append(r)
                if len(agree) > 1:
                    bad.setdefault(tid, []).extend(sorted(agree.values()))
        if bad:
            lines = [f"'{t}': " + " / ".join("replica" + ("s " if len(g) > 1 else " ")
                                               + ", ".join(map(str, g)) for g in groups)
                     for t, groups in bad.items()]
            err = ReplicaDivergenceError(
                f"after run {run}, {len(bad)} variable(s) differ between replicas that must "
                f"hold the same value (POPXL_CHECK_REPLICAS; replicas separated by / hold "
                f"different values):\n  " + "\n  ".join(lines))
            err.variables, err.run = bad, run
            raise err
