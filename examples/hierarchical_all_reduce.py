"""The hierarchical all-reduce of popxl.addons across popdist instances (`addons_api.md` §14):
reduce-scatter inside an instance, all-reduce across instances, all-gather inside the instance.

    poprun --num-replicas 8 --num-instances 2 python examples/hierarchical_all_reduce.py

With `tp = 2`, a variable grouped over `dp_group = replica_grouping(stride=2)` holds
`data[r % 2]` on global replica r. The three strided collectives of `popxl_addons.ops` then
give every local replica `idx` the value `4 * data[idx % tp]` (4 = dp_group's group size: two
copies summed by the reduce-scatter, times two by the all-reduce), with the reduce-scatter's
RTS output configured or not. Prints `ok ...` per variant, or `FAIL ...` (exit status 1).
"""
from __future__ import annotations

import sys

import numpy as np
import popdist
import popxl
from popxl import ops
from popxl_addons.ops.replicated_strided_collectives import (replicated_all_gather_strided,
                                                             replicated_all_reduce_strided,
                                                             replicated_reduce_scatter_strided)

TP = 2


def run(configure_rts: bool) -> tuple[np.ndarray, np.ndarray]:
    """(this instance's output, the shared data) of one hierarchical all-reduce."""
    ir = popxl.Ir(replication="popdist" if popdist.isPopdistEnvSet() else 8)
    irf = ir.instance_replication_factor
    data = np.arange(TP * 4, dtype=np.float32).reshape(TP, 4)     # the same on every instance
    dp_group = ir.replica_grouping(stride=TP)
    within_instance = ir.replica_grouping(stride=TP, group_size=irf // TP)
    across_instance = ir.replica_grouping(stride=irf)
    with ir.main_graph:
        v = popxl.variable(data, replica_grouping=dp_group, name="v")
        y = replicated_reduce_scatter_strided(
            v, group=within_instance,
            configure_output_for_replicated_tensor_sharding=configure_rts)
        y = replicated_all_reduce_strided(y, group=across_instance)
        y = replicated_all_gather_strided(y, group=within_instance)
        d2h = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(d2h, y)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()[d2h]
    return out.reshape(irf, *data.shape[1:]), data


def main() -> int:
    failed = 0
    for configure_rts in (True, False):
        out, data = run(configure_rts)
        want = np.stack([4 * data[idx % TP] for idx in range(out.shape[0])])
        name = (f"hierarchical all-reduce (configure_output_for_replicated_tensor_sharding="
                f"{configure_rts})")
        if out.tobytes() == want.tobytes():
            print(f"ok {name}: local replicas {out.tolist()}")
        else:
            failed += 1
            print(f"FAIL {name}: got {out.tolist()}, expected {want.tolist()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
