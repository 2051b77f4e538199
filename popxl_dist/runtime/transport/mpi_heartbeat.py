"""Heartbeats between the MPI ranks of a job that spans hosts.

A host cut off from the network tells nobody, and MPI's own sockets (MPICH's TCP transports)
wait on silently. So every rank sends each other rank a small message every `period` seconds on
a communicator of their own, from a thread of its own (so it beats while the main thread
computes), and reads the others'. A rank heard from by nobody for `timeout` seconds
(`POPXL_PEER_TIMEOUT`) is on a host that is unreachable, or its process is stopped: `silent()`
names them. `quiet_since(t)` names the ranks not heard from since `t` (after the process
manager says that some rank exited, the ranks it meant stop beating at once). A rank whose
connection MPI reports broken (an error from a call towards it: its process died) is in
`failed`.

`close()` ends the heartbeats so that MPI can finalise quietly: every rank sends each other rank
a last message and reads the others' up to theirs (messages between two ranks do not overtake
each other), so no heartbeat is left unread (MPICH's UCX transport warns about every unread
message at MPI_Finalize).
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Iterable, List, Optional

import numpy as np

__all__ = ["MPIHeartbeat"]

_BEAT, _LAST = 1, 2            # tags


class MPIHeartbeat:
    """Heartbeats of this rank on `comm` (a communicator of their own, every rank's
    `Dup()` of the job's world); see module doc."""

    def __init__(self, comm, timeout: float, period: Optional[float] = None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.peers = [p for p in range(comm.Get_size()) if p != self.rank]
        self.timeout = timeout
        self.period = period if period is not None else min(1.0, timeout / 4)
        start = time.monotonic()
        self.heard: Dict[int, float] = {p: start for p in self.peers}
        self.ended: set = set()                    # peers whose last message arrived
        self.failed: set = set()                   # peers MPI reports a broken connection to
        self._sends: Dict[int, object] = {}
        self._out = np.zeros(1, np.int64)
        self._in = np.zeros(1, np.int64)
        self._lock = threading.Lock()              # this object's MPI calls, one thread at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="popxl-mpi-heartbeat",
                                        daemon=True)
        self._thread.start()

    # --- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._stop.is_set():
                    return
                self._beat()
                self._read()
            self._stop.wait(self.period)

    def _beat(self) -> None:
        """One message to every peer whose previous one has left (a peer that cannot take
        them gets no queue of them)."""
        for p in self.peers:
            if p in self.failed:
                continue
            try:
                req = self._sends.get(p)
                if req is None or req.Test():
                    self._sends[p] = self.comm.Isend([self._out, self.MPI.INT64_T], dest=p,
                                                     tag=_BEAT)
            except self.MPI.Exception:
                self.failed.add(p)
                self._sends.pop(p, None)

    def _read(self) -> None:
        MPI = self.MPI
        st = MPI.Status()
        try:
            self._drain(st)
        except MPI.Exception:
            pass                   # (a broken connection: the sends towards it tell which)

    def _drain(self, st) -> None:
        MPI = self.MPI
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st):
            src, tag = st.Get_source(), st.Get_tag()
            self.comm.Recv([self._in, MPI.INT64_T], source=src, tag=tag)
            self.heard[src] = time.monotonic()
            if tag == _LAST:
                self.ended.add(src)

    # --- questions ----------------------------------------------------------------------
    def silent(self, peers: Iterable[int]) -> List[int]:
        """Those of `peers` not heard from for `timeout` seconds (and not ended or failed)."""
        limit = time.monotonic() - self.timeout
        return [p for p in peers if p in self.heard and p not in self.ended
                and p not in self.failed and self.heard[p] < limit]

    def quiet_since(self, t: float, peers: Iterable[int]) -> List[int]:
        """Those of `peers` not heard from since monotonic time `t`."""
        return [p for p in peers if p in self.heard and p not in self.ended
                and self.heard[p] < t]

    # --- the end ------------------------------------------------------------------------
    def close(self, patience: Optional[float] = None) -> bool:
        """Stop beating; send every peer a last message and read theirs, waiting at most
        `patience` seconds (default: `timeout`) for peers that are not silent. True when every
        peer's last message arrived and every send completed (MPI can then finalise)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        MPI = self.MPI
        with self._lock:
            if self.failed:
                return False
            try:
                lasts = [self.comm.Isend([self._out, MPI.INT64_T], dest=p, tag=_LAST)
                         for p in self.peers]
                start = time.monotonic()
                deadline = start + (self.timeout if patience is None else patience)
                # a peer already silent gets a few periods to show it is there after all
                short = min(deadline, start + 3 * self.period + 0.5)
                silent = set(self.silent(self.peers))
                while time.monotonic() < deadline:
                    self._read()
                    waiting = [p for p in self.peers if p not in self.ended]
                    sent = MPI.Request.Testall(lasts + [r for r in self._sends.values()])
                    if sent and not waiting:
                        return True
                    if time.monotonic() > short and waiting and set(waiting) <= silent & set(
                            self.silent(waiting)):
                        return False
                    time.sleep(0.002)
            except MPI.Exception:
                pass
        return False
