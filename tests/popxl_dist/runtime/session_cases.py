"""Session reliability cases, run unchanged under every backend (in process for `local`, inside
`backend_suite.py` for mpi and ray): a failed run marks the Session failed, an exception inside
`with session:` loses no training, `get_tensor_data` returns snapshots, and bad arguments are
refused before anything runs.

Each case prints `ok <case>` or `FAIL <case>: <details>`; `main()` returns the number of failures.
"""
from __future__ import annotations

import sys
import traceback

import numpy as np

import popxl
import popxl.ops as ops
from popxl.errors import EngineError, SessionFailed

R = 2


def _counter_program():
    """Per replica: v is stored to entry i of a 4-entry remote buffer, y = that entry loaded back
    is stored out, then v += x. An out-of-range offset fails that replica before it updates v
    (an out-of-range gather would not: it gives zeros). `v` is read back per replica."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        ix = popxl.h2d_stream((1,), popxl.int32, "i")
        v = popxl.variable(np.zeros(3, np.float32), name="v",
                           retrieval_mode="all_replicas")
        buf = popxl.remote_buffer((3,), popxl.float32, 4)
        offset = ops.host_load(ix, "i")
        with popxl.in_sequence():
            ops.remote_store(buf, offset, v)
            y = ops.remote_load(buf, offset)
        ys = popxl.d2h_stream(y.shape, popxl.float32, "y")
        ops.host_store(ys, y)
        ops.add_(v, ops.host_load(xs, "x"))
    return ir, xs, ix, ys, v


def case_failed_session_refuses_runs_until_reset() -> None:
    ir, xs, ix, ys, v = _counter_program()
    ones = np.ones((R, 3), np.float32)
    good = np.zeros((R, 1), np.int32)
    bad = np.array([[0], [7]], np.int32)       # replica 1 fails; replica 0 updates v
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run({xs: ones, ix: good})
        try:
            sess.run({xs: ones, ix: bad})
        except EngineError as e:
            first = e
        else:
            raise AssertionError("no error for an out-of-range remote-buffer offset")
        for call in (lambda: sess.run({xs: ones, ix: good}), lambda: sess.get_tensor_data(v),
                     sess.weights_to_host):
            try:
                call()
            except SessionFailed as e:
                assert "failed earlier" in str(e) and type(first).__name__ in str(e), str(e)
                assert e.first_error is first
            else:
                raise AssertionError("a failed Session ran again")
        sess.reset()              # back to the host weights (the initial zeros) everywhere
        sess.run({xs: ones, ix: good})
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.ones((R, 3)))


def case_exception_inside_with_keeps_training() -> None:
    ir, xs, ix, ys, v = _counter_program()
    feeds = {xs: np.full((R, 3), 2, np.float32), ix: np.zeros((R, 1), np.int32)}
    sess = popxl.Session(ir, "ipu_hw")
    try:
        with sess:
            sess.run(feeds)
            raise KeyError("user code failed")
    except KeyError:
        pass
    assert not sess.is_attached
    np.testing.assert_array_equal(sess.get_tensor_data(v), np.full((R, 3), 2))
    with sess:                    # the next attach does not upload stale weights
        sess.run(feeds)
    np.testing.assert_array_equal(sess.get_tensor_data(v), np.full((R, 3), 4))
    try:
        with sess:
            sess.run(feeds)
            raise KeyError("again")
    except KeyError:
        pass
    with sess:                    # kept on the device, then read there
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.full((R, 3), 6))


def case_get_tensor_data_is_a_read_only_snapshot() -> None:
    ir, xs, ix, ys, v = _counter_program()
    feeds = {xs: np.ones((R, 3), np.float32), ix: np.zeros((R, 1), np.int32)}
    with popxl.Session(ir, "ipu_hw") as sess:
        before = sess.get_tensor_data(v)
        sess.run(feeds)
        after = sess.get_tensor_data(v)
        sess.run(feeds)
        np.testing.assert_array_equal(before, 0)
        np.testing.assert_array_equal(after, 1)
        try:
            after[...] = 100
        except ValueError:
            pass
        else:
            raise AssertionError("the result of get_tensor_data is writable")
    np.testing.assert_array_equal(after, 1)
    np.testing.assert_array_equal(sess.get_tensor_data(v), 2)


def case_arguments_are_checked_before_running() -> None:
    ir, xs, ix, ys, v = _counter_program()
    feeds = {xs: np.ones((R, 3), np.float32), ix: np.zeros((R, 1), np.int32)}
    with popxl.Session(ir, "ipu_hw") as sess:
        outs = sess.create_host_outputs()
        outs[ys].flags.writeable = False
        for call, err, text in [
                (lambda: sess.run([feeds[xs], feeds[ix]]), TypeError, "must be a mapping"),
                (lambda: sess.run(feeds[xs]), TypeError, "must be a mapping"),
                (lambda: sess.run_with_outputs(feeds, outs), ValueError, "'y' is read-only"),
                (lambda: sess.run_with_outputs(feeds, [outs[ys]]), TypeError,
                 "must be a mapping"),
                (lambda: sess.run({xs: feeds[xs], ix: np.array([[1], [2 ** 40]])}), ValueError,
                 "stream 'i' has value 1099511627776")]:
            try:
                call()
            except err as e:
                assert text in str(e), str(e)
            else:
                raise AssertionError(f"no {err.__name__} ({text})")
        np.testing.assert_array_equal(sess.get_tensor_data(v), 0)     # nothing ran
        sess.run(feeds)                # and the Session still works
        np.testing.assert_array_equal(sess.get_tensor_data(v), 1)


def case_unstored_output_transfers_hold_zeros() -> None:
    """num_host_transfers = 3; `y` is stored once per run (after a 3-step repeat) and `z` by a
    conditional that only replica 1 takes: every transfer no host_store wrote reads 0, in `run`
    and in a `run_with_outputs` array that held other values before."""
    n = 3
    ir = popxl.Ir(replication=R)
    ir.num_host_transfers = n
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        cs = popxl.h2d_stream((), popxl.bool, "c")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        zs = popxl.d2h_stream((2,), popxl.float32, "z")
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")

        def body(a: popxl.TensorByRef):
            ops.add_(a, ops.host_load(xs, "x"))

        ops.repeat(ir.create_graph(body, acc), n, acc)
        ops.host_store(ys, acc + 0.0)
        then_g = ir.create_graph(lambda t: ops.host_store(zs, t), acc)
        else_g = ir.create_graph(lambda t: None, acc)
        ops.conditional(ops.host_load(cs, "c"), then_g, else_g, then_inputs=[acc],
                        else_inputs=[acc])
    x = np.arange(n * R * 2, dtype=np.float32).reshape(n, R, 2) + 1
    c = np.zeros((n, R), bool)
    c[:, 1] = True
    sums = x.sum(0)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run({xs: x, cs: c})
        outs = {s: np.full((n, R, 2), 7.0, np.float32) for s in (ys, zs)}
        sess.run_with_outputs({xs: x, cs: c}, outs)
    for runs, got in enumerate((out, outs), 1):      # acc keeps adding: run k stores k * sums
        np.testing.assert_array_equal(got[ys][0], sums * runs)
        np.testing.assert_array_equal(got[ys][1:], 0)
        np.testing.assert_array_equal(got[zs][0, 0], 0)          # replica 0 never stored
        np.testing.assert_array_equal(got[zs][0, 1], sums[1] * runs)
        np.testing.assert_array_equal(got[zs][1:], 0)


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def main() -> int:
    failed = 0
    for name, fn in CASES.items():
        try:
            fn()
            print(f"ok session {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported per case
            failed += 1
            print(f"FAIL session {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)
    return failed


if __name__ == "__main__":
    sys.exit(main())
