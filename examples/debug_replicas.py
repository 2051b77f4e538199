"""Replicas that drift apart: a data-parallel linear regression that all-reduces the weight
gradient but forgets the bias gradient. Nothing fails, and every replica trains its own bias.

* When the Session is created, popxl-dist's replica-consistency pass warns
  (`popxl.errors.ReplicaDivergenceWarning`), naming the variable, the op that updates it and
  the host data its update depends on.
* With POPXL_CHECK_REPLICAS=1 (or `popxl-run --check-replicas`) every run ends by comparing the
  variables across the replicas (a hash of each, also across MPI ranks or Ray actors): the first
  difference raises `popxl.errors.ReplicaDivergenceError` naming the variables, replicas and run.

    python examples/debug_replicas.py            # the bug: a warning, then the error at run 1
    python examples/debug_replicas.py --fixed    # the all-reduce in place: neither
    popxl-run --backend ray --workers 2 examples/debug_replicas.py
"""
import argparse
import os
import sys
import warnings
from typing import List

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import ReplicaDivergenceError, ReplicaDivergenceWarning

R = 4


def build(fixed: bool):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((8, 3), popxl.float32, "x")
        ts = popxl.h2d_stream((8,), popxl.float32, "t")
        w = popxl.variable(np.zeros((3,), np.float32), name="w")
        b = popxl.variable(np.zeros((), np.float32), name="b")
        x, t = ops.host_load(xs, "x"), ops.host_load(ts, "t")
        err = ops.sum(x * w, 1) + b - t                       # prediction error, (8,)
        gw = ops.collectives.replicated_all_reduce(ops.mean(x * err.reshape((8, 1)), 0),
                                                   op="mean")
        gb = ops.mean(err)
        if fixed:
            gb = ops.collectives.replicated_all_reduce(gb, op="mean")
        ops.scaled_add_(w, gw, b=-0.1)
        ops.scaled_add_(b, gb, b=-0.1)                       # the bias update
    return ir, xs, ts, w, b


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="all-reduce the bias gradient too")
    args = p.parse_args(argv)
    os.environ["POPXL_CHECK_REPLICAS"] = "1"           # read when the Session is created
    ir, xs, ts, w, b = build(args.fixed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReplicaDivergenceWarning)
        session = popxl.Session(ir, "ipu_hw")
    for warning in caught:
        print(f"warning: {warning.message}")
    assert bool(caught) != args.fixed, [str(c.message) for c in caught]
    rng = np.random.default_rng(0)
    true_w = np.array([1.0, -2.0, 0.5], np.float32)
    with session:
        for run in range(1, 4):
            x = rng.normal(size=(R, 8, 3)).astype(np.float32)
            t = (x @ true_w + 3.0).astype(np.float32)
            try:
                session.run({xs: x, ts: t})
            except ReplicaDivergenceError as e:
                print(f"run {run}: {type(e).__name__}: {e}")
                assert not args.fixed and list(e.variables) == ["b"] and e.run == 1, e
                return 0
        print(f"w = {session.get_tensor_data(w)}, b = {session.get_tensor_data(b)}")
    return 0 if args.fixed else 1


if __name__ == "__main__":
    sys.exit(main())
