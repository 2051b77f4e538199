"""popxl.debug across popdist instances (2 instances x 2 replicas):

    poprun --num-instances 2 --num-replicas 4 python instance_debug.py DIR
    popxl-run --backend ray --instances 2 --replicas 4 instance_debug.py DIR

Checks every replica's variables after each run (POPXL_CHECK_REPLICAS), captures a tensor of
this instance's replicas, records runs under DIR (POPXL_RECORD) and saves a good run's bundle
(`good-bundle PATH`), then feeds replica 3 a negative value: instance 1 stops at the log with
an uncaught NonFiniteError (its part of the bundle written), and instance 0 gets InstanceFailed
naming it from the all-reduce it waits in (its part written too): `ok debug` from instance 0.
"""
from __future__ import annotations

import os
import sys

import numpy as np

import popdist
import popxl
import popxl.ops as ops
from popxl.errors import InstanceFailed

INDEX = popdist.getInstanceIndex()


def main(directory: str) -> int:
    os.environ.update(POPXL_RECORD=directory, POPXL_DEBUG_NANS="1", POPXL_CHECK_REPLICAS="1")
    ir = popxl.Ir(replication="popdist")
    R, L = ir.replication_factor, ir.instance_replication_factor
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        y = ops.log(ops.host_load(xs, "x"))                       # the NaN's origin
        z = ops.collectives.replicated_all_reduce(y, op="mean")
        ops.var_updates.accumulate_(v, z)
        zs = popxl.d2h_stream(z.shape, z.dtype, "z")
        ops.host_store(zs, z)
    off = popdist.getReplicaIndexOffset()
    data = np.arange(1, R * 3 + 1, dtype=np.float32).reshape(R, 3)
    with popxl.Session(ir, "ipu_hw") as sess:
        with popxl.debug.capture(sess, [y]) as cap:
            sess.run({xs: data[off:off + L]})
        assert cap[y].shape == (L, 3)
        np.testing.assert_array_equal(cap[y], np.log(data[off:off + L]))
        sess.run({xs: data[off:off + L] + 1})
        print(f"good-bundle {popxl.debug.save_replay(sess)[0]}", flush=True)
        bad = data.copy()
        bad[3, 1] = -1.0
        try:
            sess.run({xs: bad[off:off + L]})
        except InstanceFailed as e:
            assert INDEX == 0 and "NonFiniteError" in str(e), e
            print(f"caught: {str(e).splitlines()[0]}", flush=True)
            print("ok debug", flush=True)
            return 0
    print("FAIL debug: the bad run did not fail", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
