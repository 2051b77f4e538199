"""Self-checking cases of popxl.debug, run unchanged under every backend (2 replicas):

    python debug_cases.py [--bundles PATH]              # local backend (in-process)
    popxl-run --backend mpi --workers 2 debug_cases.py
    popxl-run --backend ray --workers 2 debug_cases.py

* NaN / infinity origins (POPXL_DEBUG_NANS): a forward op, a backward op (naming the forward
  op it differentiates), an op in a called graph (naming the call), float16 overflow, a
  float16 all-reduce that overflows, and no error for a NaN that comes from the host; the
  error reaches the host as `NonFiniteError` on every backend. Checking changes no bits.
* Replica consistency: a program that forgets one gradient all-reduce gets the static warning
  and (POPXL_CHECK_REPLICAS) `ReplicaDivergenceError` naming that variable; the correct
  program gets neither.
* The flight recorder: replica 1 skips a collective and finishes the run: the error says
  which replica never reached which collective.
* Taps: `popxl.debug.capture` on tensors of the main graph and of a graph called twice.
* Recording (POPXL_RECORD): a failing run's bundle is written; a good run's with
  `popxl.debug.save_replay`. With `--bundles PATH` their paths are written to PATH (JSON) for
  the caller to replay in another process.

The debugging variables are read when a Session is created, so each case sets them around its
Session. Prints `ok <case>` or `FAIL <case>: <details>`; `main()` returns the failures.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
import warnings
from typing import Dict, List

import numpy as np
import popxl
import popxl.ops as ops
from popxl.errors import EngineError, NonFiniteError, ReplicaDivergenceError, \
    ReplicaDivergenceWarning

R = 2
HERE = os.path.basename(__file__)
BUNDLES: Dict[str, str] = {}


@contextlib.contextmanager
def env(**values):
    """Set POPXL_* variables (None removes) for the Sessions created inside."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _line_of(text: str) -> str:
    """`debug_cases.py:<line>` of the first line of this file that contains `text`."""
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if text in line:
                return f"{HERE}:{n}"
    raise AssertionError(text)


def _expect_nonfinite(run, *needles: str) -> NonFiniteError:
    try:
        run()
    except NonFiniteError as e:
        for n in needles:
            assert n in str(e), f"{n!r} not in: {e}"
        return e
    raise AssertionError("no NonFiniteError")


# --- NaN and infinity origins -------------------------------------------------------------
def _one_op_program(build, dtype=popxl.float32):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((4,), dtype, "x")
        y = build(ops.host_load(xs, "x"))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    return ir, xs, ys


def nan_forward() -> None:
    ir, xs, ys = _one_op_program(lambda x: ops.log(x) * 2.0)   # the log: NaN origin
    data = np.array([[1, 2, 3, 4], [1, 2, -3, 4]], np.float32)
    with env(POPXL_DEBUG_NANS="1"):
        sess = popxl.Session(ir, "ipu_hw")
    with sess:
        e = _expect_nonfinite(lambda: sess.run({xs: data}), "Log.", "replica 1", "run 1",
                              _line_of("the log: NaN origin"), "min -3, max 4, 0 NaN",
                              "produced a NaN")
        assert e.replica == 1 and e.run == 1 and e.op.type == "Log", (e.replica, e.run)
    # Off (the default): the IEEE result, silently; a NaN the host sends is no origin.
    with popxl.Session(ir, "ipu_hw") as plain:
        out = plain.run({xs: data})[ys]
    assert np.isnan(out[1, 2]) and np.isfinite(np.delete(out.ravel(), 6)).all(), out
    with env(POPXL_DEBUG_NANS="1"), popxl.Session(ir, "ipu_hw") as checked:
        got = checked.run({xs: np.where(data > 0, data, np.nan).astype(np.float32)})[ys]
    assert np.isnan(got[1, 2]), got


def nan_backward() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        g = ir.create_graph(lambda t: ops.sqrt(t), x)       # sqrt: its gradient divides
        bwd = popxl.transforms.autodiff(g)
        info = ops.call_with_info(g, x)
        dx, = ops.call(bwd.graph, popxl.constant(np.ones(3, np.float32)),
                       inputs_dict=bwd.inputs_dict(info))
        ds = popxl.d2h_stream(dx.shape, dx.dtype, "dx")
        ops.host_store(ds, dx)
    data = np.array([[1, 4, 9], [1, 0, 4]], np.float32)
    with env(POPXL_DEBUG_NANS="1"), popxl.Session(ir, "ipu_hw") as sess:
        e = _expect_nonfinite(lambda: sess.run({xs: data}), "replica 1",
                              "it is a gradient op of Sqrt.",
                              _line_of("sqrt: its gradient divides"), "produced an infinity",
                              "called from Call.")
        assert e.forward.startswith("Sqrt."), e.forward


def nan_called_graph_float16() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((4,), popxl.float16, "x")
        x = ops.host_load(xs, "x")
        g = ir.create_graph(lambda t: t * t, x)                 # float16 overflow here
        y, = ops.call(g, x)
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    data = np.array([[1, 2, 3, 4], [1, 2, 300, 4]], np.float16)
    with env(POPXL_DEBUG_NANS="1"), popxl.Session(ir, "ipu_hw") as sess:
        _expect_nonfinite(lambda: sess.run({xs: data}), "Mul.", "replica 1", "float16",
                          _line_of("float16 overflow here"), "called from Call.")


def nan_collective() -> None:
    """A float16 sum over the replicas that overflows: the all-reduce is the origin, on every
    replica; a NaN one replica loads from the host is no origin on the other."""
    ir, xs, ys = _one_op_program(lambda x: ops.collectives.replicated_all_reduce(x),
                                 popxl.float16)
    big = np.array([[1, 2, 40000, 4], [1, 2, 40000, 4]], np.float16)
    with env(POPXL_DEBUG_NANS="1"), popxl.Session(ir, "ipu_hw") as sess:
        _expect_nonfinite(lambda: sess.run({xs: big}), "ReplicatedAllReduce.", "replica 0",
                          "produced an infinity")
    fed = np.array([[1, 2, 3, 4], [1, np.nan, 3, 4]], np.float16)
    with env(POPXL_DEBUG_NANS="1"), popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: fed})[ys]
    assert np.isnan(out[:, 1]).all() and out[0, 0] == 2, out


def checks_keep_the_bits() -> None:
    """A short data-parallel training loop gives the same bits with every check on."""
    def train() -> np.ndarray:
        ir = popxl.Ir(replication=R)
        with ir.main_graph:
            xs = popxl.h2d_stream((4, 3), popxl.float32, "x")
            w = popxl.variable(np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3), name="w")
            x = ops.host_load(xs, "x")
            y = ops.gelu(x @ w)
            g = ops.collectives.replicated_all_reduce(ops.transpose(x) @ y, op="mean")
            ops.scaled_add_(w, g, b=-0.1)
        with popxl.Session(ir, "ipu_hw") as sess:
            for i in range(3):
                sess.run({xs: np.random.default_rng(i).normal(size=(R, 4, 3))
                         .astype(np.float32)})
            return sess.get_tensor_data(w).copy()

    plain = train()
    with env(POPXL_DEBUG_NANS="1", POPXL_CHECK_REPLICAS="1"):
        checked = train()
    assert plain.tobytes() == checked.tobytes()


# --- replica consistency ------------------------------------------------------------------
def _data_parallel(forget: bool):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((2, 3), popxl.float32, "x")
        w = popxl.variable(np.ones((3, 3), np.float32), name="w")
        b = popxl.variable(np.zeros((3,), np.float32), name="b")
        x = ops.host_load(xs, "x")
        y = x @ w + b
        gw = ops.collectives.replicated_all_reduce(ops.transpose(x) @ y, op="mean")
        gb = ops.sum(y, 0)
        if not forget:
            gb = ops.collectives.replicated_all_reduce(gb, op="mean")
        ops.scaled_add_(w, gw, b=-0.01)
        ops.scaled_add_(b, gb, b=-0.01)                          # b's update
    return ir, xs


def replica_consistency() -> None:
    data = np.random.default_rng(0).normal(size=(R, 2, 3)).astype(np.float32)
    for forget in (False, True):
        ir, xs = _data_parallel(forget)
        with warnings.catch_warnings(record=True) as caught, env(POPXL_CHECK_REPLICAS="1"):
            warnings.simplefilter("always")
            sess = popxl.Session(ir, "ipu_hw")
        ours = [w for w in caught if issubclass(w.category, ReplicaDivergenceWarning)]
        if not forget:
            assert not ours, [str(w.message) for w in ours]
            with sess:
                sess.run({xs: data})
            continue
        assert len(ours) == 1, [str(w.message) for w in ours]
        text = str(ours[0].message)
        assert "'b'" in text and _line_of("b's update") in text and "HostLoad" in text, text
        with sess:
            try:
                sess.run({xs: data})
            except ReplicaDivergenceError as e:
                assert "'b'" in str(e) and "'w'" not in str(e) and "run 1" in str(e), str(e)
                assert e.variables == {"b": [[0], [1]]} and e.run == 1, e.variables
            else:
                raise AssertionError("no ReplicaDivergenceError")


# --- the flight recorder ------------------------------------------------------------------
def flight_recorder() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        cs = popxl.h2d_stream((), popxl.bool, "c")
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        c, x = ops.host_load(cs, "c"), ops.host_load(xs, "x")
        then_g = ir.create_graph(
            lambda t: ops.collectives.replicated_all_reduce(t), x)   # the skipped one
        else_g = ir.create_graph(lambda t: t + 1.0, x)
        y, = ops.conditional(c, then_g, else_g, then_inputs=[x], else_inputs=[x])
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
    with tempfile.TemporaryDirectory() as tmp, env(POPXL_FLIGHT_RECORDER=tmp):
        with popxl.Session(ir, "ipu_hw") as sess:
            try:
                sess.run({cs: np.array([True, False]), xs: np.ones((R, 2), np.float32)})
            except EngineError as e:
                text = str(e)
            else:
                raise AssertionError("the divergence was not detected")
        skipped = _line_of("the skipped one")
        assert "flight recorder" in text and "replica 0" in text and "replica 1" in text, text
        assert "#1 ReplicatedAllReduce" in text and skipped in text, text
        assert ("replica 1 never reached collective #1" in text
                or "replica 1 (worker 0): finished" in text), text
        dumps = [json.load(open(os.path.join(tmp, f))) for f in sorted(os.listdir(tmp))]
        assert dumps, "no flight recorder dump"
        records = [rec for d in dumps for s in d["replicas"].values() for rec in s["records"]]
        assert any(rec["type"] == "ReplicatedAllReduce" and rec["replica"] == 0
                   and rec["end"] is None and skipped in rec["source"] for rec in records), \
            records


# --- taps ---------------------------------------------------------------------------------
def taps() -> None:
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((2, 3), popxl.float32, "x")
        w = popxl.variable(np.arange(9, dtype=np.float32).reshape(3, 3), name="w")
        x = ops.host_load(xs, "x")
        h = x @ w

        made = {}

        def block(t):
            made["relu"] = ops.relu(t - 10.0)
            return made["relu"] * 2.0

        g = ir.create_graph(block, h)
        a, = ops.call(g, h)
        b, = ops.call(g, a)
        s = ops.collectives.replicated_all_reduce(b)
        ys = popxl.d2h_stream(s.shape, s.dtype, "y")
        ops.host_store(ys, s)
    inner_t = made["relu"]
    data = np.random.default_rng(1).normal(size=(R, 2, 3)).astype(np.float32) * 10
    with popxl.Session(ir, "ipu_hw") as sess:
        with popxl.debug.capture(sess, [h, s, inner_t]) as cap:
            out = sess.run({xs: data})[ys]
        after = sess.run({xs: data})[ys]
    wv = np.arange(9, dtype=np.float32).reshape(3, 3)
    hv = data @ wv
    r1 = np.maximum(hv - 10, 0)
    r2 = np.maximum(r1 * 2 - 10, 0)
    np.testing.assert_array_equal(cap[h], hv)
    np.testing.assert_allclose(cap[s], out, rtol=0)
    calls = cap.calls(inner_t)
    assert len(calls) == 2 and all(c.site and c.site[0].startswith("Call.") for c in calls), \
        calls
    assert calls[0].site != calls[1].site
    np.testing.assert_array_equal(calls[0].value, r1)
    np.testing.assert_array_equal(calls[1].value, r2)
    assert after.tobytes() == out.tobytes()            # the program is back, same bits
    try:
        cap[inner_t]
    except ValueError as e:
        assert "capture.calls" in str(e), str(e)
    else:
        raise AssertionError("a tensor computed twice gave one value")


# --- recording ----------------------------------------------------------------------------
def recording() -> None:
    root = tempfile.mkdtemp(prefix="popxl-record-")
    ir, xs, ys = _one_op_program(lambda x: ops.log(x) * 2.0)
    with env(POPXL_DEBUG_NANS="1", POPXL_RECORD=root), popxl.Session(ir, "ipu_hw") as sess:
        good = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
        sess.run({xs: good})
        out = sess.run({xs: good + 1})[ys]
        BUNDLES["good"] = popxl.debug.save_replay(sess)[0]
        BUNDLES["good_outputs"] = out.tolist()
        bad = np.array([[1, 2, 3, 4], [1, 2, -3, 4]], np.float32)
        e = _expect_nonfinite(lambda: sess.run({xs: bad}), "replay it in one process")
        BUNDLES["failed"] = e.replay_bundle if hasattr(e, "replay_bundle") else \
            str(e).rsplit("popxl-replay ", 1)[1].split()[0]
        BUNDLES["error"] = str(e).splitlines()[0]
    for key in ("good", "failed"):
        parts = [f for f in os.listdir(BUNDLES[key]) if f.startswith("part-")]
        assert len(parts) == 2 * min(R, int(os.environ.get("POPXL_WORKERS", "1"))), parts


CASES = [nan_forward, nan_backward, nan_called_graph_float16, nan_collective,
         checks_keep_the_bits, replica_consistency, flight_recorder, taps, recording]


def main(argv: List[str] = ()) -> int:
    bundles = ""
    if "--bundles" in argv:
        bundles = argv[list(argv).index("--bundles") + 1]
    failed = 0
    for case in CASES:
        try:
            case()
            print(f"ok {case.__name__}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, counted
            failed += 1
            print(f"FAIL {case.__name__}: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                  flush=True)
    if bundles:
        with open(bundles, "w") as f:
            json.dump(BUNDLES, f)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
