"""popxl-dist's `popdist`: the PopDist API that PopXL programs call to learn which instance they
are.

Graphcore's `poprun` starts one process per instance and exports `POPDIST_*` variables; upstream's
`popdist` reads them. This emulator module does the same, and also understands a plain
`mpirun`/`mpiexec` world of N > 1 ranks with no `POPDIST_*` set: N instances with one replica each
(or `POPDIST_NUM_TOTAL_REPLICAS // N` each when that is set), so unchanged scripts run as
multi-instance. The launcher's own single-controller ranks (`popxl-run --backend mpi`) are not
instances: there the script runs once and `isPopdistEnvSet()` is False.

The MPI world is read from the launcher's environment (MPICH/hydra `PMI_RANK`/`PMI_SIZE`, Open MPI
`OMPI_COMM_WORLD_*`), so importing this module never initialises MPI. popxl-dist's launchers also
export `POPDIST_NUM_INSTANCES` and `POPDIST_INSTANCE_INDEX` (Ray instances have no MPI world).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, Optional, Tuple

__all__ = ["isPopdistEnvSet", "getInstanceIndex", "getNumInstances", "getLocalInstanceIndex",
           "getNumLocalReplicas", "getNumTotalReplicas", "getReplicaIndexOffset",
           "getNumIpusPerReplica", "getDeviceId", "execute_on_instances", "init", "barrier"]

_RANK_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")


def _env_int(name: str, default: Optional[int] = None) -> Optional[int]:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"popdist: {name} must be an int, got {value!r}") from None


def _single_controller() -> bool:
    """True in the ranks of `popxl-run --backend mpi` (one script drives every rank)."""
    return os.environ.get("POPXL_SINGLE_CONTROLLER", "") == "1"


def _mpi_world() -> Tuple[int, int]:
    """(rank, size) of the MPI world this process was launched in, (0, 1) outside MPI."""
    if _single_controller():
        return 0, 1
    for rank_var, size_var in _RANK_VARS:
        size = _env_int(size_var)
        if size is not None:
            return _env_int(rank_var, 0), size
    return 0, 1


def isPopdistEnvSet() -> bool:
    """Whether this process is one instance of a multi-instance launch (poprun, or mpirun with
    more than one rank)."""
    if _single_controller():
        return False
    return "POPDIST_NUM_TOTAL_REPLICAS" in os.environ or _mpi_world()[1] > 1


def getNumInstances() -> int:
    """Number of instances (processes) of the launch; 1 outside poprun/mpirun."""
    n = _env_int("POPDIST_NUM_INSTANCES")
    return n if n is not None else _mpi_world()[1]


def getInstanceIndex() -> int:
    """This instance's index in [0, getNumInstances()); 0 outside poprun/mpirun."""
    i = _env_int("POPDIST_INSTANCE_INDEX")
    return i if i is not None else _mpi_world()[0]


def getLocalInstanceIndex() -> int:
    """This instance's index among the instances on its host."""
    i = _env_int("POPDIST_LOCAL_INSTANCE_INDEX")
    if i is not None:
        return i
    if not _single_controller():
        for var in _LOCAL_RANK_VARS:
            j = _env_int(var)
            if j is not None:
                return j
    return getInstanceIndex()


def getNumTotalReplicas() -> int:
    """The global replication factor (all instances)."""
    n = _env_int("POPDIST_NUM_TOTAL_REPLICAS")
    return n if n is not None else getNumInstances() * getNumLocalReplicas()


def getNumLocalReplicas() -> int:
    """Replicas driven by this instance (1 when unset)."""
    n = _env_int("POPDIST_NUM_LOCAL_REPLICAS")
    if n is not None:
        return n
    total = _env_int("POPDIST_NUM_TOTAL_REPLICAS")
    if total is not None:
        instances = getNumInstances()
        if total % instances:
            raise ValueError(f"popdist: POPDIST_NUM_TOTAL_REPLICAS={total} is not divisible by "
                             f"the {instances} instances")
        return total // instances
    return 1


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica (instances own contiguous blocks)."""
    off = _env_int("POPDIST_REPLICA_INDEX_OFFSET")
    return off if off is not None else getInstanceIndex() * getNumLocalReplicas()


def getNumIpusPerReplica() -> int:
    return _env_int("POPDIST_NUM_IPUS_PER_REPLICA", 1)


def getDeviceId() -> int:
    """The (emulated) device id of this instance; poprun exports it as `POPDIST_DEVICE_ID`."""
    return _env_int("POPDIST_DEVICE_ID", getLocalInstanceIndex())


def execute_on_instances(instances: Iterable[int], fn: Callable, *args, **kwargs):
    """Call `fn(*args, **kwargs)` on the listed instances only; returns its result there, None
    elsewhere."""
    if getInstanceIndex() in set(instances):
        return fn(*args, **kwargs)
    return None


def init(*args, **kwargs) -> None:
    """Upstream initialises the PopDist backend; the emulator has nothing to set up."""


def barrier() -> None:
    """popxl-dist extension (upstream popdist has none; programs use MPI's): wait until every
    instance gets here. Unlike `mpi4py.MPI.COMM_WORLD.Barrier()` it also spans Ray instances
    (`popxl-run --backend ray --instances N`), where each instance's MPI world is itself."""
    from popxl.runtime.instances.join import barrier as _barrier

    _barrier()
