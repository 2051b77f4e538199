"""Read intermediate tensors of every replica without editing the program:
`popxl.debug.capture(session, tensors)` around `session.run` keeps each tensor's value on every
replica, `(replicas, *shape)`, on every backend, for tensors of the main graph and of called
graphs (one value per call: `capture.calls(tensor)`).

A two-layer MLP whose layers are one graph called twice; we look at the hidden activations of
both calls and at the logits, and check them against NumPy.

    python examples/debug_capture.py
    popxl-run --backend mpi --workers 2 examples/debug_capture.py
"""
import sys
from typing import List

import numpy as np

import popxl
import popxl.ops as ops

R = 2


def main(argv: List[str] = None) -> int:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (6, 6)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (6, 6)).astype(np.float32)
    ir = popxl.Ir(replication=R)
    kept = {}
    with ir.main_graph:
        xs = popxl.h2d_stream((4, 6), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        W1, W2 = popxl.variable(w1, name="W1"), popxl.variable(w2, name="W2")

        def layer(t, w):
            kept["hidden"] = ops.gelu(t @ w)         # a tensor of the called graph
            return kept["hidden"]

        g = ir.create_graph(layer, x, W1)
        h1, = ops.call(g, x, W1)
        logits, = ops.call(g, h1, W2)
        out = popxl.d2h_stream(logits.shape, logits.dtype, "logits")
        ops.host_store(out, logits)
    data = rng.normal(size=(R, 4, 6)).astype(np.float32)
    with popxl.Session(ir, "ipu_hw") as session:
        with popxl.debug.capture(session, [h1, kept["hidden"]]) as cap:
            result = session.run({xs: data})[out]
    calls = cap.calls(kept["hidden"])
    for call in calls:
        print(f"'{kept['hidden'].id}' in {' > '.join(call.site)}: shape {call.value.shape}, "
              f"mean per replica {call.value.mean(axis=(1, 2))}")
    gelu = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    ref_h1 = gelu(data @ w1)
    np.testing.assert_allclose(cap[h1], ref_h1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(calls[1].value, gelu(ref_h1 @ w2), rtol=1e-5, atol=1e-6)
    assert np.array_equal(calls[1].value, result)       # the second call's output: the logits
    print("captured values match NumPy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
