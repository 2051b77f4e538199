"""MPICH's shared-memory segments (`/dev/shm/mpich_shm_*`, one per node, mapped by every rank
in MPI_Init). MPICH unlinks it in MPI_Finalize, so a job whose ranks are killed leaves it behind.
Unlinked as soon as every rank has mapped it, it is freed with the last process that maps it,
however the job ends."""
from __future__ import annotations

import os
from typing import List

__all__ = ["mpich_segments", "unlink_mpich_segments"]

_PREFIX = "/dev/shm/mpich_shm_"


def mpich_segments() -> List[str]:
    """Paths of the MPICH segments this process maps (existing or already unlinked)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        i = line.find(_PREFIX)
        if i >= 0:
            path = line[i:].split()[0]
            if path not in found:
                found.append(path)
    return found


def unlink_mpich_segments() -> None:
    """Unlink this process's MPICH segments. Call only once every rank on this node has mapped
    them (after a collective that follows MPI_Init)."""
    for path in mpich_segments():
        try:
            os.unlink(path)
        except OSError:
            pass            # another rank of the node was first
