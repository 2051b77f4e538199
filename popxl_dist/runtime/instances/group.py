"""The instances of a popdist launch as one process sees them: who the peers are, a `Transport`
for the collectives between them, object gathers, and failure notices; and the process-wide
group (`current_group`).

Every instance runs the whole script, so they create their popdist Sessions, runs and weight
transfers in the same order: a per-process run counter names each of them identically everywhere,
and every message carries it (a peer that sends data of another run or collective has diverged).

Two kinds of group, each in its own module: over MPI (`mpi.py`: poprun, `mpirun -n N`,
`popxl-run --backend mpi --instances N`) on communicators duplicated from `COMM_WORLD`; and over
the job's authenticated links (`links.py`: `popxl-run --backend ray --instances N`,
built by the launcher before the script starts). `join.py` picks one and installs the
failure hooks. This module imports neither.

Failure: an instance whose script fails tells the others (`fail`), which raise `InstanceFailed`
naming it from the collective they wait in; an instance that exits while the others still need it
says goodbye first, after the data it sent (a goodbye is never read ahead of that data).
"""
from __future__ import annotations

import pickle
import sys
import threading
from typing import Any, List, Optional

import numpy as np

from ...engine.comm import Transport
from ..env import collective_timeout

__all__ = ["InstanceGroup", "current_group", "set_current_group", "flush_stdio", "ACK_GRACE"]

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
        failure handling and timeout). Only the job's own instances can send here (the
        transports are MPI's or the authenticated links), so their bytes are unpickled."""
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
LOCK = threading.Lock()


def current_group() -> Optional[InstanceGroup]:
    """The process's instance group (None before the first popdist Session or after the
    script ended)."""
    return _GROUP


def set_current_group(group: Optional[InstanceGroup]) -> None:
    """Install the process's group (or clear it)."""
    global _GROUP
    _GROUP = group


def flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
