"""Where did the NaN come from? A data-parallel MNIST classifier whose hand-written
log-softmax loss takes the log of a probability that underflows to zero. Without checks the
loss just turns NaN. With POPXL_DEBUG_NANS=1 (or `popxl-run --debug-nans`) the first op that
makes a NaN or an infinity raises `popxl.errors.NonFiniteError` naming it, the line of this file
that built it (for a gradient op also the forward op it differentiates), the replica, the run
and its inputs.

    python examples/debug_nans.py                       # the checks on: the Log op is named
    python examples/debug_nans.py --no-check            # what the IPU tells you: loss = nan
    popxl-run --backend mpi --workers 2 examples/debug_nans.py    # the same error, from a rank
"""
import argparse
import os
import sys
from typing import List

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import NonFiniteError
from popxl_launch.data import load_mnist

R = 2          # replicas
BATCH = 16     # per replica


def build(lr: float):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((BATCH, 784), popxl.float32, "x")
        ls = popxl.h2d_stream((BATCH, 10), popxl.float32, "onehot")
        rng = np.random.default_rng(0)
        w = popxl.variable(rng.normal(0, 0.05, (784, 10)).astype(np.float32), name="w")
        x, onehot = ops.host_load(xs, "x"), ops.host_load(ls, "onehot")

        def loss_fn(x_, w_, onehot_):
            logits = x_ @ w_ * 40.0                    # too confident: probabilities underflow
            probs = ops.softmax(logits, axis=1)
            log_probs = ops.log(probs)                 # log(0) = -inf: the origin
            return ops.mean(ops.sum(log_probs * onehot_, 1)) * -1.0

        fwd = ir.create_graph(loss_fn, x, w, onehot)
        bwd = popxl.transforms.autodiff(fwd, grads_required=[fwd.inputs[1]])
        info = ops.call_with_info(fwd, x, w, onehot)
        loss = info.outputs[0]
        dw, = ops.call(bwd.graph, popxl.constant(1.0), inputs_dict=bwd.inputs_dict(info))
        dw = ops.collectives.replicated_all_reduce(dw, op="mean")
        ops.scaled_add_(w, dw, b=-lr)
        out = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(out, loss)
    return ir, xs, ls, out


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-check", action="store_true", help="run without POPXL_DEBUG_NANS")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    if not args.no_check:
        os.environ["POPXL_DEBUG_NANS"] = "1"           # read when the Session is created
    images, labels = load_mnist("train")[:2]
    x = (images[:args.steps * R * BATCH].reshape(args.steps, R, BATCH, 784) / 255.0)
    onehot = np.eye(10, dtype=np.float32)[labels[:args.steps * R * BATCH]]
    onehot = onehot.reshape(args.steps, R, BATCH, 10)
    ir, xs, ls, out = build(lr=0.1)
    with popxl.Session(ir, "ipu_hw") as session:
        for step in range(args.steps):
            try:
                loss = session.run({xs: x[step].astype(np.float32), ls: onehot[step]})[out]
            except NonFiniteError as e:
                print(f"step {step}: {type(e).__name__}: {e}")
                assert e.op.type == "Log" and e.source.endswith(f"{os.path.basename(__file__)}:"
                                                                f"{_line('the origin')}"), e
                return 0
            print(f"step {step}: loss per replica {loss}")
    if args.no_check:
        return 0
    print("no NaN was found (unexpected)", file=sys.stderr)
    return 1


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if marker in line and "_line(" not in line)


if __name__ == "__main__":
    sys.exit(main())
