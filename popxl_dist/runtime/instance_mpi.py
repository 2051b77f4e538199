"""Instances over MPI: one rank per instance (poprun, `mpirun -n N python script.py`).

Two communicators duplicated from `COMM_WORLD` (never `COMM_WORLD` itself, so the script's own
mpi4py traffic never mixes with ours): `data` carries the collectives' bytes, `ctrl` the notices
(an instance failed / said goodbye). Every wait polls (see `mpi._Backoff`), reads notices, checks
that the peers it waits for are alive, and notices a peer that sends data of another run or
collective (diverged), so no collective hangs.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..errors import CollectiveTimeout, InstanceFailed, WorkerDied
from .instance_group import ACK_GRACE, InstanceGroup, _flush
from .mpi import MPITransport, _alive, _Backoff
from .mpi_segments import unlink_mpich_segments

__all__ = ["MPIInstanceGroup"]

NOTICE = 21
_LIVENESS_PERIOD = 0.5
_CHECK_PERIOD = 0.001     # seconds between looks at notices / peers while a collective waits
_RUN_BITS, _TAG_BITS = 13, 15


def _mpi_tag(run_id: int, tag: int) -> int:
    return ((run_id % (1 << _RUN_BITS)) << _TAG_BITS) | tag


def _split_tag(mtag: int) -> Tuple[int, int]:
    return mtag >> _TAG_BITS, mtag & ((1 << _TAG_BITS) - 1)


class _InstanceTransport(MPITransport):
    """Collective bytes between instances (receive buffers reused as in `MPITransport`)."""

    def __init__(self, group: "MPIInstanceGroup"):
        super().__init__(group)
        self.group = group

    def exchange(self, sends, recvs, tag):
        group = self.group
        MPI = group.MPI
        mtag = _mpi_tag(self.run_id, tag)
        bufs = {p: self._buffer(p, n, dtype) for p, (n, dtype) in recvs.items()}
        pending = {p: group.data.Irecv([bufs[p].view(np.uint8), MPI.BYTE], source=p, tag=mtag)
                   for p in bufs}
        keep = [np.ascontiguousarray(a) for a in sends.values()]
        sreqs = [group.data.Isend([a.view(np.uint8), MPI.BYTE], dest=p, tag=mtag)
                 for p, a in zip(sends, keep)]
        start = time.monotonic()
        next_check = start + _CHECK_PERIOD
        backoff = _Backoff()
        try:
            while True:
                for p in [p for p, r in pending.items() if r.Test()]:
                    del pending[p]
                if not pending and MPI.Request.Testall(sreqs):
                    break
                now = time.monotonic()
                if now >= next_check:        # notices, liveness, divergence: not every poll
                    next_check = now + _CHECK_PERIOD
                    group.check(pending, mtag)
                    if now - start > group.timeout:
                        silent = sorted(pending) or sorted(sends)
                        err = CollectiveTimeout(
                            f"instance {group.index}: collective (tag {tag}) got no data from "
                            f"instance(s) {silent} within {group.timeout:g} s "
                            f"(POPXL_COLLECTIVE_TIMEOUT)")
                        err.workers, err.timeout = tuple(silent), group.timeout
                        raise err
                backoff.wait()
        except BaseException as e:
            group.mark_broken(e)
            for r in pending.values():
                try:
                    r.Cancel()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            raise
        return bufs


class MPIInstanceGroup(InstanceGroup):
    """The instances of an MPI launch; instance i is rank i of `COMM_WORLD`."""

    name = "mpi"

    def __init__(self, index: int, size: int):
        super().__init__(index, size)
        try:
            from mpi4py import MPI
        except ModuleNotFoundError as e:
            if e.name != "mpi4py":
                raise
            raise ModuleNotFoundError('popdist instances over MPI: mpi4py is not installed (the '
                                      'mpi extra: pip install -e ".[mpi]" in the popxl-dist '
                                      'clone)', name="mpi4py") from None
        world = MPI.COMM_WORLD
        if (world.Get_rank(), world.Get_size()) != (index, size):
            raise RuntimeError(f"popdist says this is instance {index} of {size}, but it is MPI "
                               f"rank {world.Get_rank()} of {world.Get_size()}: launch one MPI "
                               f"rank per instance (poprun / mpirun -n {size})")
        self.MPI = MPI
        self.rank = index
        self.data = self._dup(world)
        self.ctrl = self._dup(world)
        self.gone: Dict[int, Tuple[str, int, str]] = {}   # peer -> (kind, origin, message)
        self._last_liveness = time.monotonic()
        self._peer_signal = False
        self.transport = _InstanceTransport(self)
        self.procs = self.allgather((socket.gethostname(), os.getpid()))
        # Every instance has attached MPICH's shared memory by now: unlinked, it goes with the
        # last process however the job ends (a killed or aborted job would leave it behind).
        unlink_mpich_segments()
        self._usr1 = threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        if self._usr1:
            # Under popxl's launchers hydra (-disable-auto-cleanup) signals SIGUSR1 when a rank
            # exits: look at the peers at once instead of at the next liveness period.
            signal.signal(signal.SIGUSR1, self._on_peer_exit)

    def _on_peer_exit(self, signum, frame) -> None:
        self._peer_signal = True

    def _ignore_exit_notices(self) -> None:
        """Back to ignoring hydra's SIGUSR1: Python resets the signals it handles to their
        default action (terminate) when it finalises, and MPI_Finalize then waits for the other
        ranks, whose exits signal this one."""
        if self._usr1 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _dup(self, world):
        """`world.Dup()` without blocking forever if an instance never gets here."""
        comm, req = world.Idup()
        deadline = time.monotonic() + self.timeout
        backoff = _Backoff()
        while not req.Test():
            if time.monotonic() > deadline:
                raise CollectiveTimeout(
                    f"instance {self.index}: the other instances did not start their popdist "
                    f"Session within {self.timeout:g} s (POPXL_COLLECTIVE_TIMEOUT)")
            backoff.wait()
        return comm

    # --- notices and liveness -------------------------------------------------------------
    def _read_notices(self) -> None:
        MPI = self.MPI
        st = MPI.Status()
        while self.ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE, status=st):
            kind, origin, message = self.ctrl.recv(source=st.Get_source(), tag=NOTICE)
            self.gone.setdefault(st.Get_source(), (kind, origin, message))

    def check(self, waiting: Dict[int, object], mtag: int) -> None:
        """Raise if the launch failed, or a peer in `waiting` (peer -> its pending receive)
        exited, died or diverged."""
        MPI = self.MPI
        self._read_notices()
        for peer, (kind, origin, message) in sorted(self.gone.items()):
            if kind == "failed":
                raise InstanceFailed(f"instance {origin} failed: {message}", origin)
        st = MPI.Status()
        for peer, req in waiting.items():
            # A message of another collective from a peer whose data for this one has not
            # arrived means it skipped this one (messages between two ranks do not overtake:
            # the test after the probe sees any earlier arrival).
            if self.data.Iprobe(source=peer, tag=MPI.ANY_TAG, status=st) \
                    and st.Get_tag() != mtag and not req.Test():
                (run, tag), (want_run, want_tag) = _split_tag(st.Get_tag()), _split_tag(mtag)
                raise InstanceFailed(
                    f"instance {peer} is in another collective (run {run}, tag {tag}) than "
                    f"instance {self.index} (run {want_run}, tag {want_tag}): the instances "
                    f"diverged (they must build the same programs and run them in the same "
                    f"order)", peer)
        for peer in waiting:
            if peer in self.gone:
                raise InstanceFailed(f"instance {peer} ended its script without joining this "
                                     f"collective (it exited): the instances diverged", peer)
        now = time.monotonic()
        if now - self._last_liveness > _LIVENESS_PERIOD or self._peer_signal:
            self._last_liveness = now
            self._peer_signal = False
            dead = self._dead(list(waiting))
            if dead:
                self._read_notices()          # a goodbye / failure notice says more
                if not any(p in self.gone for p in dead):
                    host, pid = self.procs[dead[0]]
                    err = WorkerDied(f"instance {dead[0]} (MPI rank {dead[0]}, pid {pid} on "
                                     f"{host}) died")
                    err.workers = dead
                    err.instance = dead[0]
                    raise err
                self.check(waiting, mtag)

    def _dead(self, peers: Sequence[int]) -> List[int]:
        host = socket.gethostname()
        return [p for p in peers if self.procs[p][0] == host and not _alive(self.procs[p][1])]

    # --- ending ---------------------------------------------------------------------------
    def _notify(self, kind: str, origin: int, message: str) -> list:
        # Failed peers still wait for this notice (as their acknowledgement); gone ones do not.
        return [self.ctrl.isend((kind, origin, message), dest=p, tag=NOTICE)
                for p in self.peers if p not in self.gone or self.gone[p][0] == "failed"]

    def fail(self, message: str, origin: int) -> bool:
        if self.closed:
            return True
        self.closed = True
        self._ignore_exit_notices()
        self._notify("failed", origin, message)
        deadline = time.monotonic() + ACK_GRACE
        backoff = _Backoff()
        while time.monotonic() < deadline:
            self._read_notices()
            missing = [p for p in self.peers if p not in self.gone]
            if not missing or not [p for p in missing if p not in self._dead(missing)]:
                return not missing
            backoff.wait()
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._ignore_exit_notices()
        reqs = self._notify("bye", self.index, "")
        deadline = time.monotonic() + 1.0
        backoff = _Backoff()
        while not self.MPI.Request.Testall(reqs) and time.monotonic() < deadline:
            backoff.wait()

    def abort(self, code: int) -> None:
        _flush()
        self.MPI.COMM_WORLD.Abort(code)
