"""Debugging hooks in the compiled program: absent when off (the generated code is the plain
program's), present when asked; NaN / infinity origins and floating-point checks against
NumPy's own verdicts, with and without the compiled loops; the flight recorder's summary."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.engine.flight import summarise
from popxl.errors import NonFiniteError


def _program(build, shape=(4,), dtype=popxl.float32, fp_checks=False):
    ir = popxl.Ir()
    if fp_checks:
        ir._pb_ir.getSessionOptions().enableFloatingPointChecks = True
    with ir.main_graph:
        xs = popxl.h2d_stream(shape, dtype, "x")
        y = build(ops.host_load(xs, "x"))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    return ir, xs, ys


def _sources(sess) -> str:
    program = sess._runtime.worker.program
    return "".join(cg.source for cg in program._by_filename.values())


def test_off_the_program_is_the_plain_one(monkeypatch):
    ir, xs, ys = _program(lambda x: ops.gelu(x) * 2.0)
    for var in ("POPXL_DEBUG_NANS", "POPXL_CHECK_REPLICAS", "POPXL_RECORD"):
        monkeypatch.delenv(var, raising=False)
    with popxl.Session(ir, "cpu") as sess:
        plain = _sources(sess)
        assert "_CHK" not in plain and "_TAP" not in plain and "sites" not in plain
        assert sess._runtime.worker.recorder is None
        assert sess._runtime.worker.replica_check is None
    monkeypatch.setenv("POPXL_DEBUG_NANS", "1")
    ir2, _, _ = _program(lambda x: ops.gelu(x) * 2.0)
    with popxl.Session(ir2, "cpu") as sess:
        assert "_CHK" in _sources(sess)


@pytest.mark.parametrize("numba", ["1", "0"])
@pytest.mark.parametrize("op, data, kind", [
    (lambda x: ops.log(x), [1, 2, -3, 4], "NaN"),
    (lambda x: ops.sqrt(x), [1, -2, 3, 4], "NaN"),
    (lambda x: ops.exp(x * 100.0), [1, 2, 3, 4], "infinity"),
    (lambda x: x / (x - x), [1, 2, 3, 4], None),          # 1/0 = inf
    (lambda x: ops.gelu(x * 1e38 * 10.0), [1, 2, 3, 4], "infinity"),
])
@pytest.mark.parametrize("mode", ["nans", "fp_checks"])
def test_origin_found_where_numpy_says_a_value_went_bad(monkeypatch, op, data, kind, numba,
                                                        mode):
    monkeypatch.setenv("POPXL_NUMBA", numba)
    if mode == "nans":
        monkeypatch.setenv("POPXL_DEBUG_NANS", "1")
    ir, xs, ys = _program(op, fp_checks=mode == "fp_checks")
    x = np.array(data, np.float32)
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(NonFiniteError) as info:
            sess.run({xs: x})
    text = str(info.value)
    assert "test_instrument.py" in text and "replica 0, run 1" in text, text
    if mode == "fp_checks":
        assert "enableFloatingPointChecks" in text
    elif kind:
        assert f"produced {'a NaN' if kind == 'NaN' else 'an infinity'}" in text


def test_propagated_nan_is_not_an_origin(monkeypatch):
    monkeypatch.setenv("POPXL_DEBUG_NANS", "1")
    ir, xs, ys = _program(lambda x: ops.exp(x) + 1.0)
    with popxl.Session(ir, "cpu") as sess:
        out = sess.run({xs: np.array([0, np.nan, 1, np.inf], np.float32)})[ys]
    ref = np.exp(np.array([0, np.nan, 1, np.inf], np.float32)) + np.float32(1)
    np.testing.assert_array_equal(out, ref)


def test_in_place_op_origin_names_the_modified_input(monkeypatch):
    monkeypatch.setenv("POPXL_DEBUG_NANS", "1")
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        w = popxl.variable(np.full(2, 3e38, np.float32), name="w")
        ops.var_updates.accumulate_(w, ops.host_load(xs, "x"))
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(NonFiniteError, match=r"(?s)Accumulate.*w \(modified\).*1 inf"):
            sess.run({xs: np.array([1, 3e38], np.float32)})


def test_summary_says_who_never_reached_the_collective():
    rec = {"replica": 0, "worker": 0, "run": 2, "seq": 3, "op": "ReplicatedAllReduce.7 'a'",
           "type": "ReplicatedAllReduce", "source": "t.py:9", "group": {}, "shape": [2],
           "dtype": "float32", "start": 100.0, "end": None}
    done = dict(rec, seq=2, op="ReplicatedAllReduce.5 'b'", source="t.py:8", end=99.0)
    text = summarise({0: {"records": [done, rec], "finished": False},
                      1: {"records": [dict(done, replica=1, worker=1)], "finished": True}},
                     now=104.0)
    assert "replica 0 (worker 0): waiting in #3 ReplicatedAllReduce.7 'a' (built at t.py:9) " \
           "for 4.0 s" in text, text
    assert "replica 1 (worker 1): finished the run after 2 collective(s)" in text, text
    assert "=> replica 1 never reached collective #3" in text, text
    other = dict(rec, replica=1, worker=1, op="ReplicatedAllReduce.8 'c'", source="t.py:12")
    text = summarise({0: {"records": [rec]}, 1: {"records": [other]}}, now=101.0)
    assert "=> the replicas diverged at collective #3: replica 0 in " \
           "ReplicatedAllReduce.7 'a' (built at t.py:9); replica 1 in " \
           "ReplicatedAllReduce.8 'c' (built at t.py:12)" in text, text
