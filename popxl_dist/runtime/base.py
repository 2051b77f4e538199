"""The interface a Session drives; each backend implements it."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from .._ir.records import IrData, TensorKind

__all__ = ["Runtime", "to_host_layout"]


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

    def close(self) -> None:
        """Free the workers' copy of this program (called when the Session is collected)."""
