"""`Ir(replication="popdist")` in one process: the placement it reads from the popdist
environment, its checks, and the instance runtime's consistency checks (no launch here; the
multi-instance runs are in runtime/test_instances.py)."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
from popxl import ops
from popxl.engine.comm import Layout
from popxl.runtime.instances.runtime import _check_instances, program_signature

_VARS = ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET",
         "POPDIST_NUM_INSTANCES", "POPDIST_INSTANCE_INDEX", "POPDIST_LOCAL_INSTANCE_INDEX",
         "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "POPXL_SINGLE_CONTROLLER", "POPXL_INSTANCE_LINKS")


@pytest.fixture
def env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    # Keep pytest's own excepthook: the launcher-side hooks are tested with real launches.
    monkeypatch.setenv("POPXL_INSTANCE_LAUNCHER", "1")
    return monkeypatch


def second_of_two_instances(env, total: int = 8) -> None:
    env.setenv("PMI_RANK", "1")
    env.setenv("PMI_SIZE", "2")
    env.setenv("POPDIST_NUM_TOTAL_REPLICAS", str(total))


def test_popdist_ir_is_global_with_a_local_share(env):
    second_of_two_instances(env)
    ir = popxl.Ir(replication="popdist")
    assert (ir.replication_factor, ir.instance_replication_factor) == (8, 4)
    opts = ir._pb_ir.getSessionOptions()
    assert (opts.globalReplicationFactor, opts.globalReplicaOffset,
            opts.replicatedGraphCount) == (8, 4, 4)
    assert opts.enableDistributedReplicatedGraphs and opts.enableReplicatedGraphs
    p = ir._data.instance
    assert (p.num_instances, p.index, p.offset, p.local, p.total) == (2, 1, 4, 4, 8)
    assert ir.replica_grouping().group_size == 8          # groupings are over global replicas
    ir.replication_factor = 8                             # the same value is fine
    with pytest.raises(ValueError, match="launcher's global count"):
        ir.replication_factor = 4


def test_one_replica_per_rank_under_plain_mpirun(env):
    env.setenv("OMPI_COMM_WORLD_RANK", "3")
    env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    ir = popxl.Ir(replication="popdist")
    assert (ir.replication_factor, ir.instance_replication_factor) == (4, 1)
    assert ir._data.instance.offset == 3


def test_a_single_instance_holds_every_replica(env):
    env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    ir = popxl.Ir(replication="popdist")
    assert ir._data.instance is None
    assert (ir.replication_factor, ir.instance_replication_factor) == (4, 4)
    env.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    with pytest.raises(ValueError, match="a single instance must hold every replica"):
        popxl.Ir(replication="popdist")


def test_inconsistent_popdist_environment_is_named(env):
    second_of_two_instances(env)
    env.setenv("POPDIST_REPLICA_INDEX_OFFSET", "6")
    with pytest.raises(ValueError, match=r"replicas \[6, 10\) do not fit in the 8 global"):
        popxl.Ir(replication="popdist")
    env.delenv("POPDIST_REPLICA_INDEX_OFFSET")
    env.setenv("POPDIST_INSTANCE_INDEX", "2")
    with pytest.raises(ValueError, match="instance index is out of range"):
        popxl.Ir(replication="popdist")


def test_session_outside_an_mpi_world_says_how_to_launch(env):
    pytest.importorskip("mpi4py")
    second_of_two_instances(env, total=2)
    env.setenv("POPDIST_INSTANCE_INDEX", "0")
    env.setenv("POPDIST_NUM_INSTANCES", "2")
    env.delenv("PMI_RANK")
    env.delenv("PMI_SIZE")
    ir = popxl.Ir(replication="popdist")
    with pytest.raises(RuntimeError, match="launch one MPI rank per instance"):
        popxl.Session(ir, "ipu_hw")


def _program(extra_op: bool):
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        y = ops.collectives.replicated_all_reduce(x)
        if extra_op:
            y = y + 1.0
    return ir._data


def test_instances_must_agree_on_the_program_and_the_replicas():
    sig, other = program_signature(_program(False)), program_signature(_program(True))
    assert sig == program_signature(_program(False)) and sig != other
    ok = [(0, 2, 4, sig), (2, 2, 4, sig)]
    assert _check_instances(ok, 1) == [(0, 2), (2, 4)]
    with pytest.raises(ValueError, match=r"instance 1 built a different program than instance "
                                         r"0 \(graph 'main': 1 ops here, 2 ops there\)"):
        _check_instances([(0, 2, 4, sig), (2, 2, 4, other)], 0)
    with pytest.raises(ValueError, match="disagree on the global replication factor"):
        _check_instances([(0, 2, 4, sig), (2, 2, 6, sig)], 0)
    with pytest.raises(ValueError, match="contiguous blocks"):
        _check_instances([(2, 2, 4, sig), (0, 2, 4, sig)], 0)


def test_layout_of_explicit_blocks():
    layout = Layout(6, 3, [(0, 2), (2, 4), (4, 6)])
    assert layout.worker_of(5) == 2 and list(layout.replicas_of(1)) == [2, 3]
    for bad in ([(0, 2), (3, 6)], [(0, 2), (2, 5)], [(0, 3), (2, 6)]):
        with pytest.raises(ValueError, match="do not cover"):
            Layout(6, 2, bad)
