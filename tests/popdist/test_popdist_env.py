"""popdist reads poprun's POPDIST_* variables, and a plain MPI world of N > 1 ranks."""
import pytest

import popdist
import popdist.popart

_VARS = ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET",
         "POPDIST_NUM_INSTANCES", "POPDIST_INSTANCE_INDEX", "POPDIST_LOCAL_INSTANCE_INDEX",
         "POPDIST_NUM_IPUS_PER_REPLICA", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
         "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
         "POPXL_SINGLE_CONTROLLER", "POPDIST_DEVICE_ID")


@pytest.fixture
def env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_outside_any_launcher(env):
    assert not popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex()) == (1, 0)
    assert (popdist.getNumLocalReplicas(), popdist.getNumTotalReplicas()) == (1, 1)
    assert popdist.getReplicaIndexOffset() == 0
    assert popdist.getNumIpusPerReplica() == 1


def test_poprun_variables(env):
    env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "8")
    env.setenv("POPDIST_NUM_LOCAL_REPLICAS", "4")
    env.setenv("POPDIST_REPLICA_INDEX_OFFSET", "4")
    env.setenv("POPDIST_NUM_IPUS_PER_REPLICA", "2")
    env.setenv("PMI_RANK", "1")
    env.setenv("PMI_SIZE", "2")
    assert popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex()) == (2, 1)
    assert (popdist.getNumLocalReplicas(), popdist.getNumTotalReplicas()) == (4, 8)
    assert popdist.getReplicaIndexOffset() == 4
    assert popdist.getNumIpusPerReplica() == 2


def test_plain_mpi_world_is_one_replica_per_rank(env):
    env.setenv("OMPI_COMM_WORLD_RANK", "2")
    env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex()) == (4, 2)
    assert (popdist.getNumLocalReplicas(), popdist.getNumTotalReplicas()) == (1, 4)
    assert popdist.getReplicaIndexOffset() == 2
    env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "8")
    assert popdist.getNumLocalReplicas() == 2
    assert popdist.getReplicaIndexOffset() == 4


def test_total_not_divisible_by_instances_is_an_error(env):
    env.setenv("PMI_RANK", "0")
    env.setenv("PMI_SIZE", "3")
    env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    with pytest.raises(ValueError, match="not divisible by the 3 instances"):
        popdist.getNumLocalReplicas()


def test_single_controller_ranks_are_not_instances(env):
    env.setenv("PMI_RANK", "1")
    env.setenv("PMI_SIZE", "2")
    env.setenv("POPXL_SINGLE_CONTROLLER", "1")
    assert not popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex()) == (1, 0)


def test_execute_on_instances_and_session_options(env):
    env.setenv("PMI_RANK", "1")
    env.setenv("PMI_SIZE", "2")
    assert popdist.execute_on_instances({0}, lambda: "ran") is None
    assert popdist.execute_on_instances([1], lambda x: x + 1, 1) == 2

    class Opts:
        pass

    opts = Opts()
    popdist.popart.configureSessionOptions(opts)
    assert (opts.globalReplicationFactor, opts.globalReplicaOffset,
            opts.replicatedGraphCount) == (2, 1, 1)
    assert opts.enableDistributedReplicatedGraphs and not opts.enableReplicatedGraphs
