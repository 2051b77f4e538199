"""How a process joins the instances of its popdist launch: the process-wide instance group (over
MPI, or the links a Ray launcher built before the script started), the instances' barrier, and
what happens when an instance's script fails or ends.

Failure: an instance whose script fails tells the others (`fail_instance`), which raise
`InstanceFailed` naming it from the collective they wait in; an instance that exits while the
others still need it says goodbye first. Under a plain `mpirun`, an uncaught exception in an
instance then aborts the MPI job (as `python -m mpi4py` does), because MPI cannot finalise while
other ranks wait: the excepthook is installed by `Ir(replication="popdist")`.
"""
from __future__ import annotations

import atexit
import os
import sys

from .group import LOCK, InstanceGroup, current_group, flush_stdio, set_current_group

__all__ = ["instance_group", "barrier", "fail_instance", "close_instance_group",
           "install_failure_hooks", "LINKS_ENV"]

# Set by the Ray instance launcher: the process's group is the one it built over the job's
# links (never MPI's).
LINKS_ENV = "POPXL_INSTANCE_LINKS"


def _on_links() -> bool:
    return os.environ.get(LINKS_ENV) == "1"


def instance_group(placement) -> InstanceGroup:
    """The process-wide group of `placement`'s launch: the one the Ray launcher installed, else
    a group over MPI (created by the first popdist Session)."""
    with LOCK:
        group = current_group()
        if group is not None and not group.closed:
            if (group.index, group.size) != (placement.index, placement.num_instances):
                raise RuntimeError(f"popdist placement changed within the process: "
                                   f"{placement.describe()}, but this process joined as "
                                   f"instance {group.index} of {group.size}")
            return group
        if _on_links():
            raise RuntimeError(f"instance {placement.index}: the links between the Ray "
                               f"instances are closed (the script ended or failed)")
        from .mpi import MPIInstanceGroup

        group = MPIInstanceGroup(placement.index, placement.num_instances)
        set_current_group(group)
        return group


def barrier() -> None:
    """Return once every popdist instance of the launch has called `barrier` (at once when there
    is one instance). Works over MPI ranks and Ray instances alike, unlike `COMM_WORLD.Barrier`,
    which under Ray instances spans one process."""
    import popdist

    from ...popdist_env import InstancePlacement

    if not popdist.isPopdistEnvSet() or popdist.getNumInstances() < 2:
        return
    group = current_group()
    if group is None or group.closed:
        group = instance_group(InstancePlacement(
            num_instances=popdist.getNumInstances(), index=popdist.getInstanceIndex(),
            offset=popdist.getReplicaIndexOffset(), local=popdist.getNumLocalReplicas(),
            total=popdist.getNumTotalReplicas()))
    group.allgather(None)


def fail_instance(exc: BaseException) -> None:
    """This instance's script failed with `exc`: tell the others, and abort the job if they
    did not all take notice (they may be blocked outside popxl, e.g. in their own MPI calls)."""
    group = current_group()
    origin = getattr(exc, "instance", -1)
    message = f"{type(exc).__name__}: {exc}"
    if group is not None and not group.closed:
        origin = group.index if origin is None or origin < 0 else origin
        if origin != group.index:
            _record_cause(group.index, origin)
        if not group.fail(message, origin):
            group.abort(1)
    elif group is None and not _on_links():
        from .mpi import abort_before_first_session

        abort_before_first_session()


def _record_cause(index: int, origin: int) -> None:
    """Tell the launcher (`POPXL_EXIT_DIR`) that this instance failed because `origin` did, so
    that the launch's exit code is the originating instance's."""
    directory = os.environ.get("POPXL_EXIT_DIR", "")
    if directory:
        try:
            with open(os.path.join(directory, f"{index}.caused_by"), "w") as f:
                f.write(str(origin))
        except OSError:
            pass


def close_instance_group() -> None:
    """Goodbye to the other instances (the script ended); a later Session starts a new group."""
    group = current_group()
    if group is not None and not group.closed:
        group.close()
    set_current_group(None)


_hooks_installed = False
_previous_excepthook = None


def _from_ctrl_c(value: BaseException) -> bool:
    """A KeyboardInterrupt, or an error it caused (Python wraps one raised while a class is
    being created, e.g. during an import, in a RuntimeError)."""
    seen = set()
    while value is not None and id(value) not in seen:
        if isinstance(value, KeyboardInterrupt):
            return True
        seen.add(id(value))
        value = value.__cause__ or value.__context__
    return False


def _excepthook(tp, value, tb) -> None:
    if _from_ctrl_c(value):
        # Ctrl-C is no crash: one line, no traceback.
        group = current_group()
        which = f"instance {group.index}" if group is not None else "this instance"
        print(f"popxl: {which} interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    else:
        (_previous_excepthook or sys.__excepthook__)(tp, value, tb)
    flush_stdio()
    fail_instance(value)


def install_failure_hooks() -> None:
    """Called by `Ir(replication="popdist")` with several instances: an uncaught exception tells
    the other instances (and aborts the MPI job if they cannot all be told); a normal exit says
    goodbye. Launchers that run the script themselves (`popxl_launch.instance_main`, the Ray
    instance actors) call `fail_instance` / `close_instance_group` directly instead."""
    global _hooks_installed, _previous_excepthook
    if _hooks_installed or os.environ.get("POPXL_INSTANCE_LAUNCHER") == "1":
        return
    _hooks_installed = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(close_instance_group)
