"""`Session.copy_weights_to` (popxl-dist extension): the self-checking cases of `copy_cases.py`
in process (one worker, worker threads) and under `popxl-run` on mpi and ray (one launch each),
and the argument errors."""
from __future__ import annotations

import numpy as np
import popxl
import pytest
from popxl import ops

import copy_cases
from test_backends import job_processes, job_segments, needs_mpi, needs_ray, nothing_left, \
    popxl_run, wait_until

CASES = copy_cases.__file__


@pytest.mark.parametrize("workers", [None, "2", "3"])
def test_copy_cases_in_process(monkeypatch, capsys, workers):
    if workers:
        monkeypatch.setenv("POPXL_WORKERS", workers)
    assert copy_cases.main() == 0, capsys.readouterr().out[-4000:]


def _program(shape=(2, 3), dtype=popxl.float32, R=2, rg=None, mode=None, name="w"):
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        grouping = ir.replica_grouping(*rg) if rg else None
        G = grouping.num_groups if grouping else 1
        data = np.zeros(((G,) if G > 1 else ()) + shape, dtype.as_numpy())
        v = popxl.variable(data, dtype, name, replica_grouping=grouping, retrieval_mode=mode)
        ops.identity(v)
    return popxl.Session(ir, "ipu_hw"), v


def test_copy_result_matches_write_variables_data_while_detached():
    src, a = _program()
    dst, b = _program(name="b")
    src.write_variable_data(a, np.arange(6, dtype=np.float32).reshape(2, 3))
    src.copy_weights_to(dst, {a: b})
    np.testing.assert_array_equal(dst.get_tensor_data(b), np.arange(6).reshape(2, 3))
    src.copy_weights_to(dst, {})          # nothing to do


@pytest.mark.parametrize("bad, error, match", [
    (dict(shape=(3, 2)), ValueError, r"'w' has shape \(2, 3\) but its destination 'b' has "
                                     r"shape \(3, 2\)"),
    (dict(dtype=popxl.float16), TypeError, "'w' has dtype float32 but its destination 'b' "
                                           "has dtype float16"),
    (dict(rg=(1, 1)), ValueError, r"different host layouts"),
    (dict(mode="all_replicas"), NotImplementedError, "all_replicas"),
])
def test_mismatched_pairs_are_refused(bad, error, match):
    src, a = _program()
    dst, b = _program(name="b", **bad)
    with pytest.raises(error, match=match):
        src.copy_weights_to(dst, {a: b})


def test_wrong_arguments_are_refused():
    src, a = _program()
    dst, b = _program(name="b")
    with pytest.raises(TypeError, match="`other` must be a popxl.Session"):
        src.copy_weights_to("dst", {a: b})
    with pytest.raises(TypeError, match="`mapping` must be a Mapping"):
        src.copy_weights_to(dst, [(a, b)])
    with pytest.raises(TypeError, match="every destination must be a popxl.Variable"):
        src.copy_weights_to(dst, {a: np.zeros((2, 3))})
    with pytest.raises(ValueError, match="source variable 'b' does not belong"):
        src.copy_weights_to(dst, {b: b})
    with pytest.raises(ValueError, match="destination variable 'w' does not belong"):
        src.copy_weights_to(dst, {a: a})
    ir = popxl.Ir(replication=2)        # (an Ir is frozen once a Session exists: build first)
    with ir.main_graph:
        w, x = (popxl.variable(np.zeros((2, 3), np.float32), name=n) for n in ("w", "x"))
    with pytest.raises(ValueError, match="destination 'b' is mapped from both"):
        popxl.Session(ir, "ipu_hw").copy_weights_to(dst, {w: b, x: b})


def _assert_cases_pass(res) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "FAIL" not in res.stdout, out[-4000:]
    assert res.stdout.count("ok copy") == len(copy_cases.CASES), out[-4000:]


@needs_mpi
def test_copy_cases_on_mpi():
    _assert_cases_pass(popxl_run("mpi", 2, CASES))


@needs_ray
def test_copy_cases_on_ray():
    res = popxl_run("ray", 2, CASES)
    _assert_cases_pass(res)
    assert wait_until(lambda: nothing_left(res.sid)), (job_processes(res.sid),
                                                      job_segments(res.sid))


def test_copy_within_one_session_swaps_like_the_host_copy():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        a = popxl.variable(np.zeros(3, np.float32), name="a")
        b = popxl.variable(np.ones(3, np.float32), name="b")
        ops.identity(a + b)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        session.copy_weights_to(session, {a: b, b: a})
        got = session.get_tensors_data([a, b])
        np.testing.assert_array_equal(got[a], np.ones(3))
        np.testing.assert_array_equal(got[b], np.zeros(3))
        session.copy_weights_to(session, {a: b})          # on the worker
        np.testing.assert_array_equal(session.get_tensor_data(b), np.ones(3))
