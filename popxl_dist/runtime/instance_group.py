"""The instances of a popdist launch as one process sees them: who the peers are, a `Transport`
for the collectives between them, object gathers, and failure notices.

Every instance runs the whole script, so they create their popdist Sessions, runs and weight
transfers in the same order: a per-process run counter names each of them identically everywhere,
and every message carries it (a peer that sends data of another run or collective has diverged).

Two kinds of group: over MPI (`instance_mpi.py`: poprun, `mpirun -n N`, `popxl-run --backend mpi
--instances N`) on communicators duplicated from `COMM_WORLD`, so a script's own mpi4py traffic
never mixes with ours; and over TCP sockets with a launcher "hub" (`instance_socket.py`:
`popxl-run --backend ray --instances N`).

Failure: an instance whose script fails tells the others (`fail_instance`), which raise
`InstanceFailed` naming it from the collective they wait in; an instance that exits while the
others still need it says goodbye first. Under a plain `mpirun`, an uncaught exception in an
instance then aborts the MPI job (as `python -m mpi4py` does), because MPI cannot finalise while
other ranks wait: the excepthook is installed by `Ir(replication="popdist")`.
"""
from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
import time
from typing import Any, List, Optional

import numpy as np

from ..engine.comm import Transport
from .env import collective_timeout

__all__ = ["InstanceGroup", "instance_group", "current_group", "install_failure_hooks",
           "fail_instance", "close_instance_group", "ACK_GRACE"]

ACK_GRACE = 2.0          # seconds a failing instance waits for the others to take notice
_GATHER_TAG = 32767      # object gathers are runs of their own; no op collides within one


class InstanceGroup:
    """This process's view of the launch's instances (see module doc)."""

    name = "instances"

    def __init__(self, index: int, size: int):
        self.index = index
        self.size = size
        self.timeout = collective_timeout()
        self.run_id = 0
        self.closed = False
        self.broken: Optional[str] = None     # why collectives can no longer be trusted
        self.transport: Transport

    @property
    def peers(self) -> List[int]:
        return [p for p in range(self.size) if p != self.index]

    def next_run(self) -> int:
        """Start the next run (program run, fragment or gather): the same id on every
        instance."""
        if self.broken:
            raise RuntimeError(f"instance {self.index}: the popdist instances cannot run "
                               f"collectives after a failed one ({self.broken}); end the "
                               f"script (leftover messages of the failed collective would "
                               f"be mistaken for new ones)")
        self.run_id += 1
        self.transport.run_id = self.run_id
        return self.run_id

    def allgather(self, obj: Any) -> List[Any]:
        """Every instance's `obj`, in instance order (a collective, with the transport's
        failure handling and timeout)."""
        self.next_run()
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        peers = self.peers
        got = self.transport.exchange({p: np.array([data.size], np.int64) for p in peers},
                                      {p: (1, np.dtype(np.int64)) for p in peers}, _GATHER_TAG)
        sizes = {p: int(got[p][0]) for p in peers}
        got = self.transport.exchange({p: data for p in peers},
                                      {p: (sizes[p], np.dtype(np.uint8)) for p in peers},
                                      _GATHER_TAG)
        out: List[Any] = [None] * self.size
        out[self.index] = obj
        for p in peers:
            out[p] = pickle.loads(got[p].tobytes())
        return out

    def mark_broken(self, exc: BaseException) -> None:
        """A collective failed half-way (called by the transports)."""
        if self.broken is None:
            self.broken = f"{type(exc).__name__}: {exc}"

    def fail(self, message: str, origin: int) -> bool:
        """Tell the other instances that `origin` failed (this instance, or the one whose
        failure made this one fail); True if they all took notice within `ACK_GRACE`."""
        raise NotImplementedError

    def close(self) -> None:
        """Say goodbye (this instance's script ended) and free the connections."""
        raise NotImplementedError

    def abort(self, code: int) -> None:
        """Stop every instance now (after a failure the others did not all notice)."""


_GROUP: Optional[InstanceGroup] = None
_LOCK = threading.Lock()


def current_group() -> Optional[InstanceGroup]:
    return _GROUP


def instance_group(placement) -> InstanceGroup:
    """The process-wide group of `placement`'s launch (created by the first popdist Session):
    over the launcher's hub when `POPXL_INSTANCE_HUB` is set, else over MPI."""
    global _GROUP
    with _LOCK:
        if _GROUP is not None and not _GROUP.closed:
            if (_GROUP.index, _GROUP.size) != (placement.index, placement.num_instances):
                raise RuntimeError(f"popdist placement changed within the process: "
                                   f"{placement.describe()}, but this process joined as "
                                   f"instance {_GROUP.index} of {_GROUP.size}")
            return _GROUP
        hub = os.environ.get("POPXL_INSTANCE_HUB", "").strip()
        if hub:
            from .instance_socket import SocketInstanceGroup

            _GROUP = SocketInstanceGroup(placement.index, placement.num_instances, hub)
        else:
            from .instance_mpi import MPIInstanceGroup

            _GROUP = MPIInstanceGroup(placement.index, placement.num_instances)
        return _GROUP


def barrier() -> None:
    """Return once every popdist instance of the launch has called `barrier` (at once when there
    is one instance). Works over MPI ranks and Ray instances alike, unlike `COMM_WORLD.Barrier`,
    which under Ray instances spans one process."""
    import popdist

    from ..popdist_env import InstancePlacement

    if not popdist.isPopdistEnvSet() or popdist.getNumInstances() < 2:
        return
    group = _GROUP
    if group is None or group.closed:
        group = instance_group(InstancePlacement(
            num_instances=popdist.getNumInstances(), index=popdist.getInstanceIndex(),
            offset=popdist.getReplicaIndexOffset(), local=popdist.getNumLocalReplicas(),
            total=popdist.getNumTotalReplicas()))
    group.allgather(None)


def fail_instance(exc: BaseException) -> None:
    """This instance's script failed with `exc`: tell the others, and abort the job if they
    did not all take notice (they may be blocked outside popxl, e.g. in their own MPI calls)."""
    group = _GROUP
    origin = getattr(exc, "instance", -1)
    message = f"{type(exc).__name__}: {exc}"
    if group is not None and not group.closed:
        origin = group.index if origin is None or origin < 0 else origin
        if origin != group.index:
            _record_cause(group.index, origin)
        if not group.fail(message, origin):
            group.abort(1)
    elif group is None and not os.environ.get("POPXL_INSTANCE_HUB"):
        _abort_mpi_world_if_started()


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
    global _GROUP
    group = _GROUP
    if group is not None and not group.closed:
        group.close()
    _GROUP = None


# Seconds a failing instance waits to join MPI in order to abort it: the others join when they
# create their first Session, which on a loaded machine can take many seconds (5 s was too short).
_INIT_PATIENCE = 20.0


def _abort_mpi_world_if_started() -> None:
    """An instance failed before its first popdist Session. The others may be waiting for it in
    MPI (in MPI_Init, which completes only when every rank joins, or in the Session's first
    collective), and MPI cannot finalise while they do: join MPI if needed (giving up after
    `_INIT_PATIENCE` seconds, when the others are not waiting there) and abort the job."""
    def abort() -> None:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            # Said before MPI_Abort: hydra may stop forwarding output as the abort arrives, so
            # MPICH's own "application called MPI_Abort" line is sometimes lost.
            print(f"popxl: MPI rank {MPI.COMM_WORLD.Get_rank()} failed before its first popdist "
                  f"Session: aborting the MPI job (MPI_Abort)", file=sys.stderr, flush=True)
            _flush()
            time.sleep(0.2)          # lets the launcher forward this output before the abort
            MPI.COMM_WORLD.Abort(1)

    if "mpi4py.MPI" in sys.modules:
        abort()
        return
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return
    t = threading.Thread(target=abort, name="popxl-abort", daemon=True)
    t.start()
    t.join(_INIT_PATIENCE)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


_hooks_installed = False
_previous_excepthook = None


def _excepthook(tp, value, tb) -> None:
    (_previous_excepthook or sys.__excepthook__)(tp, value, tb)
    _flush()
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
