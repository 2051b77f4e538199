"""A hang explained: replica 1 takes the other branch of a conditional and so skips the
all-reduce replica 0 waits in. Every worker keeps a flight recorder of its replicas' last
collectives (op, the line that built it, group, shape, dtype, sequence number, start and end);
the error then says which replica stopped where and which collective the others wait in, and
POPXL_FLIGHT_RECORDER=DIR (or `popxl-run --flight-recorder DIR`) writes every worker's record.

    python examples/debug_hang.py
    POPXL_COLLECTIVE_TIMEOUT=5 popxl-run --backend mpi --workers 2 examples/debug_hang.py
"""
import sys
from typing import List

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import EngineError

R = 2


def main(argv: List[str] = None) -> int:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        cs = popxl.h2d_stream((), popxl.bool, "sync")
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        sync, x = ops.host_load(cs, "sync"), ops.host_load(xs, "x")
        reduce_g = ir.create_graph(
            lambda t: ops.collectives.replicated_all_reduce(t), x)     # replica 1 skips it
        local_g = ir.create_graph(lambda t: t * 2.0, x)
        y, = ops.conditional(sync, reduce_g, local_g, [x], [x])
        total = ops.collectives.replicated_all_reduce(y)
        out = popxl.d2h_stream(total.shape, total.dtype, "total")
        ops.host_store(out, total)
    with popxl.Session(ir, "ipu_hw") as session:
        ok = session.run({cs: np.array([True, True]), xs: np.ones((R, 3), np.float32)})[out]
        print(f"both replicas reduce: {ok[0]}")
        try:
            session.run({cs: np.array([True, False]), xs: np.ones((R, 3), np.float32)})
        except EngineError as e:             # diverged, or CollectiveTimeout across workers
            print(f"{type(e).__name__}: {e}")
            assert "flight recorder" in str(e) and "replica 1" in str(e), e
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
