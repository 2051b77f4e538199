"""A message-passing transport for workers that can push arrays into each other's inbox:
threads in one process (the local backend with several workers) and Ray actors."""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Hashable, Tuple

import numpy as np

from ...engine.comm import Transport
from ...errors import CollectiveTimeout, RunAborted

__all__ = ["Mailbox", "MailboxTransport"]

_DIVERGE_GRACE = 1.0      # seconds a finished peer's in-flight data may still take


class Mailbox:
    """A worker's inbox: arrays keyed by (sender, run id, tag), in arrival order."""

    def __init__(self):
        self._cv = threading.Condition()
        self._box: Dict[Tuple[int, int, int], list] = {}
        self._aborted: Dict[int, str] = {}       # run id -> reason
        self._finished: Dict[int, set] = {}      # run id -> workers that finished that run

    def put(self, src: int, run_id: int, tag: Hashable, arr: np.ndarray) -> None:
        with self._cv:
            self._box.setdefault((src, run_id, tag), []).append(arr)
            self._cv.notify_all()

    def abort(self, run_id: int, reason: str) -> None:
        """Make every wait of run `run_id` (and earlier) raise RunAborted."""
        with self._cv:
            self._aborted[run_id] = reason
            self._cv.notify_all()

    def peer_finished(self, src: int, run_id: int) -> None:
        """Worker `src` completed run `run_id`: waiting for more of its data would hang."""
        with self._cv:
            self._finished.setdefault(run_id, set()).add(src)
            self._cv.notify_all()

    def start_run(self, run_id: int) -> None:
        """Forget messages and aborts of earlier runs (late arrivals of a failed run)."""
        with self._cv:
            for key in [k for k in self._box if k[1] < run_id]:
                del self._box[key]
            for d in (self._aborted, self._finished):
                for r in [r for r in d if r < run_id]:
                    del d[r]

    def take(self, wanted: Dict[int, Hashable], run_id: int, timeout: float,
             describe: Callable[[], str]) -> Dict[int, np.ndarray]:
        """Wait for the message tagged `wanted[src]` of run `run_id` from each src, and remove
        them."""
        deadline = time.monotonic() + timeout
        gone_since = None
        with self._cv:
            while True:
                if run_id in self._aborted:
                    raise RunAborted(self._aborted[run_id])
                missing = [s for s, tag in wanted.items() if not self._box.get((s, run_id, tag))]
                if not missing:
                    return {s: self._pop((s, run_id, tag)) for s, tag in wanted.items()}
                gone = [s for s in missing if s in self._finished.get(run_id, ())]
                if gone:
                    # Data sent just before finishing may arrive after the notice (Ray gives
                    # no ordering between different callers), hence the grace period.
                    if gone_since is None:
                        gone_since = time.monotonic()
                    elif time.monotonic() - gone_since > _DIVERGE_GRACE:
                        raise RuntimeError(
                            f"{describe()}: worker(s) {gone} finished the run without joining "
                            f"this collective: the replicas diverged")
                left = deadline - time.monotonic()
                if left <= 0:
                    err = CollectiveTimeout(f"{describe()}: no data from worker(s) {missing} "
                                            f"after {timeout:g} s")
                    err.workers, err.timeout = tuple(missing), timeout
                    raise err
                self._cv.wait(min(left, 0.1 if gone_since is not None else 1.0))

    def _pop(self, key) -> np.ndarray:
        q = self._box[key]
        arr = q.pop(0)
        if not q:
            del self._box[key]
        return arr


class MailboxTransport(Transport):
    """`deliver(peer, src, run_id, tag, array)` pushes into the peer's Mailbox; it must copy or
    serialise the array before returning (the communicator reuses it).

    Messages carry a per-peer sequence number besides the collective's tag: a collective may
    exchange twice with the same peer, and Ray may run two deliveries of one caller out of
    order on a threaded actor."""

    def __init__(self, index: int, mailbox: Mailbox, deliver: Callable, timeout: float):
        self.index = index
        self.mailbox = mailbox
        self.deliver = deliver
        self.timeout = timeout
        self.run_id = 0
        self._sent: Dict[int, int] = {}
        self._received: Dict[int, int] = {}

    def start_run(self, run_id: int) -> None:
        self.run_id = run_id
        self._sent.clear()
        self._received.clear()
        self.mailbox.start_run(run_id)

    def exchange(self, sends, recvs, tag):
        for peer, arr in sends.items():
            seq = self._sent.get(peer, 0)
            self._sent[peer] = seq + 1
            self.deliver(peer, self.index, self.run_id, (tag, seq), arr)
        wanted = {}
        for p in recvs:
            seq = self._received.get(p, 0)
            self._received[p] = seq + 1
            wanted[p] = (tag, seq)
        got = self.mailbox.take(wanted, self.run_id, self.timeout,
                                lambda: f"worker {self.index}: collective (tag {tag})")
        for p, (n, dtype) in recvs.items():
            a = got[p]
            if a.size != n or a.dtype != dtype:
                raise RuntimeError(
                    f"worker {self.index}: collective (tag {tag}) expected {n} {np.dtype(dtype)} "
                    f"values from worker {p}, got {a.size} {a.dtype}: the replicas diverged")
        return got
