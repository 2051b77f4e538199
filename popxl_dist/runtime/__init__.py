"""Runtimes place an Ir's replicas on workers. `create_runtime` picks the backend named by
`POPXL_BACKEND` (default `local`) with `POPXL_WORKERS` workers, or the instance runtime of a
multi-instance popdist launch."""
from __future__ import annotations

from .._ir.records import IrData
from .base import Runtime
from .env import backend_name, worker_count

__all__ = ["create_runtime", "Runtime"]


# Set by `popxl.debug.inspection.inspecting`: makes the runtime of a Session that only records
# its Ir (`popxl-inspect`).
_INSPECTING = None


def create_runtime(ir: IrData) -> Runtime:
    """The runtime of `POPXL_BACKEND` for this Ir, on the process-wide pool of that backend;
    a popdist instance's own runtime for `Ir(replication="popdist")` with several instances.
    With the profiler on (`POPXL_PROFILE`) it is wrapped in a `debug.profile.ProfiledRuntime`.
    A program whose arrays cannot fit this machine gets a MemoryWarning first."""
    if _INSPECTING is not None:             # popxl-inspect: record the Ir, run nothing
        return _INSPECTING(ir)
    from ..debug.memory import check_session_fits

    check_session_fits(ir)                  # warns before anything is allocated
    runtime = _create_runtime(ir)
    if ir.debug.profile_dir:
        from ..debug.profile import ProfiledRuntime

        return ProfiledRuntime(runtime, ir)
    return runtime


def _create_runtime(ir: IrData) -> Runtime:
    if ir.instance is not None:
        from .instances.runtime import InstanceRuntime

        return InstanceRuntime(ir)
    name = backend_name()
    if name == "local":
        workers = worker_count(default=1)
        if workers == 1 or ir.replication_factor == 1:
            from .backends.local import LocalRuntime

            return LocalRuntime(ir)
        from .backends.pool import PoolRuntime
        from .backends.threads import thread_pool

        return PoolRuntime(ir, thread_pool(workers))
    if name == "mpi":
        from .backends.mpi import mpi_pool
        from .backends.pool import PoolRuntime

        return PoolRuntime(ir, mpi_pool())
    from .backends.pool import PoolRuntime
    from .backends.ray import ray_pool

    return PoolRuntime(ir, ray_pool(worker_count(default=2)))
