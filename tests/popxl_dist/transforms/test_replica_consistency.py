"""The static replica-consistency pass: which variables a program lets drift apart between
replicas that must agree, and which it does not (each case also run, with POPXL_CHECK_REPLICAS,
so the static verdict is checked against the replicas' real values)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import ReplicaDivergenceError, ReplicaDivergenceWarning
from popxl._ir.partitions import coarser_or_equal, meet
from popxl.transforms.replica_consistency import analyse

C = ops.collectives


def _verdict(ir, feeds, monkeypatch, runs: int = 2):
    """(static divergences' variable ids, runtime divergent variable ids) of running `ir`."""
    monkeypatch.setenv("POPXL_CHECK_REPLICAS", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = popxl.Session(ir, "ipu_hw")
    static = sorted({str(w.message).split("'")[1] for w in caught
                     if issubclass(w.category, ReplicaDivergenceWarning)})
    runtime = []
    with sess:
        try:
            for _ in range(runs):
                sess.run(feeds())
        except ReplicaDivergenceError as e:
            runtime = sorted(e.variables)
    return static, runtime


def _feed(stream, shape, R, seed=[0]):
    def make():
        seed[0] += 1
        return {stream: np.random.default_rng(seed[0]).normal(size=(R, *shape))
                .astype(np.float32)}
    return make


def test_partition_algebra():
    assert meet((0, 0, 2, 2), (0, 1, 0, 1)) == (0, 1, 2, 3)
    assert meet((0, 0, 0, 0), (0, 0, 2, 2)) == (0, 0, 2, 2)
    assert coarser_or_equal((0, 0, 0, 0), (0, 1, 0, 1))
    assert not coarser_or_equal((0, 1, 0, 1), (0, 0, 0, 0))
    assert coarser_or_equal((0, 1, 0, 1), (0, 1, 0, 1))


@pytest.mark.parametrize("reduce_grad", [True, False])
def test_data_parallel_update(monkeypatch, reduce_grad):
    R = 4
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        g = ops.host_load(xs, "x") * w
        if reduce_grad:
            g = C.replicated_all_reduce(g, op="mean")
        ops.scaled_add_(w, g, b=-0.1)
    expect = [] if reduce_grad else ["w"]
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == (expect, expect)


@pytest.mark.parametrize("group, diverges", [((2, 2), False), ((1, 2), True), ((1, 4), False)])
def test_grouped_variable_needs_its_groups_equal(monkeypatch, group, diverges):
    """A variable with groups {0, 2} and {1, 3} may differ between the groups: an all-reduce
    over its own grouping (or every replica) suffices, one over other groups does not."""
    R = 4
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        rg = ir.replica_grouping(stride=2, group_size=2)
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones((2, 3), np.float32), name="w", replica_grouping=rg)
        g = C.replicated_all_reduce(ops.host_load(xs, "x") * w, op="mean",
                                    group=ir.replica_grouping(*group))
        ops.scaled_add_(w, g, b=-0.1)
    expect = ["w"] if diverges else []
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == (expect, expect)


def test_tensor_times_data_parallel_grads_meet_in_the_end(monkeypatch):
    """TP x DP: a weight replicated over everything is updated from a gradient made the same
    within each TP group by a TP all-reduce, then over the DP groups: the same everywhere."""
    R = 4
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        tp = ir.replica_grouping(stride=1, group_size=2)
        dp = ir.replica_grouping(stride=2, group_size=2)
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        g = C.replicated_all_reduce(ops.host_load(xs, "x") * w, group=tp)
        g = C.replicated_all_reduce(g, op="mean", group=dp)
        ops.scaled_add_(w, g, b=-0.1)
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == ([], [])


def test_accumulator_may_differ_mid_run(monkeypatch):
    """A gradient accumulator holds each replica's own sum until it is all-reduced in place
    and used; zeroed afterwards, nothing differs when the run ends."""
    R = 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        acc = popxl.variable(np.zeros(3, np.float32), name="acc")
        ops.var_updates.accumulate_(acc, ops.host_load(xs, "x") * w)
        C.replicated_all_reduce_(acc, op="mean")
        ops.scaled_add_(w, acc, b=-0.1)
        ops.var_updates.accumulator_zero_(acc)
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == ([], [])


def test_stash_is_scratch_but_a_copied_update_is_not(monkeypatch):
    """A variable stored with fresh per-replica data (a stash) may differ; `copy_var_update_`
    of a value computed from the variable itself is an update."""
    R = 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        stash = popxl.variable(np.zeros((2, 3), np.float32), name="stash")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        x = ops.host_load(xs, "x")
        ops.dynamic_update_(stash, popxl.constant(np.array([1], np.uint32)),
                            x.reshape((1, 3)), axes=[0], sizes=[1], no_overlap=True)
        ops.var_updates.copy_var_update_(w, w - x * 0.1)
    report = analyse(ir._data)
    assert [d.variable for d in report.divergences] == ["w"]
    assert report.scratch == ("stash",)
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == (["w"], ["w"])


def test_all_replicas_retrieval_and_sharded_variables_may_differ(monkeypatch):
    R = 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((4,), popxl.float32, "x")
        per = popxl.variable(np.zeros(4, np.float32), name="per",
                             retrieval_mode="all_replicas")
        buf = popxl.replica_sharded_buffer((4,), popxl.float32)
        popxl.remote_replica_sharded_variable(np.zeros(4, np.float32), buf, 0, name="rts")
        x = ops.host_load(xs, "x")
        ops.var_updates.accumulate_(per, x)
        shard = ops.remote_load(buf, 0)
        ops.remote_store(buf, 0, shard + C.replicated_reduce_scatter(x, op="local"))
    assert _verdict(ir, _feed(xs, (4,), R), monkeypatch) == ([], [])


def test_updates_inside_called_graphs_and_loops(monkeypatch):
    """A by-reference update inside a graph called in a loop: the op and line inside the graph
    are named."""
    R = 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        x = ops.host_load(xs, "x")

        def step(v: popxl.TensorByRef, d):
            ops.scaled_add_(v, d, b=-0.1)       # the update in the graph

        g = ir.create_graph(step, w, x)
        ops.repeat(g, 3, w, x)
    report = analyse(ir._data)
    assert [d.variable for d in report.divergences] == ["w"]
    assert report.divergences[0].op.type == "ScaledAddLhsInplace"
    assert "test_replica_consistency.py" in report.divergences[0].op.debug
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == (["w"], ["w"])


@pytest.mark.parametrize("reduce_grad", [True, False])
def test_remote_variable_update(monkeypatch, reduce_grad):
    """A remote variable loaded, updated and stored back (phased execution's pattern)."""
    R = 2
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        buf = popxl.remote_buffer((3,), popxl.float32, 1)
        popxl.remote_variable(np.ones(3, np.float32), buf, 0, name="w")
        w = ops.remote_load(buf, 0)
        g = ops.host_load(xs, "x") * w
        if reduce_grad:
            g = C.replicated_all_reduce(g, op="mean")
        ops.scaled_add_(w, g, b=-0.1)
        ops.remote_store(buf, 0, w)
    expect = [] if reduce_grad else ["w"]
    assert _verdict(ir, _feed(xs, (3,), R), monkeypatch) == (expect, expect)


def test_one_replica_is_never_analysed():
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.ones(3, np.float32), name="w")
        ops.scaled_add_(w, ops.host_load(xs, "x"))
    assert analyse(ir._data).divergences == []
