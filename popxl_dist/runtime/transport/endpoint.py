"""One process's end of a worker pool that talks through its own links (the Ray backend): the
messages it received, the collectives' transport, and the serve loop of a worker process.

Worker 0 is the host (the driver): it sends commands and receives replies. Every other worker
runs `serve()`: it answers commands until told to stop or the host is gone. Collective data goes
directly between workers. Every wait polls without spinning for long (`Backoff`), checks the
processes it waits for, and honours aborts, so a failed or dead worker becomes an exception on
the host, not a hang.
"""
from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ...engine.comm import Transport
from ...errors import (
    CollectiveTimeout,
    HostUnreachable,
    RunAborted,
    WorkerDied,
    WorkerError,
)
from ..env import peer_timeout
from ..process.polling import Backoff, process_alive
from .links import ABORT, BYE, CMD, DATA, FAILED, FIN, OUTPUT, REPLY, Link, Message
from .reachability import host_unreachable, hosts_of
from .reported import flight_of, message_of, reported

__all__ = ["Endpoint", "EndpointTransport", "Silence", "serve", "encode", "decode", "describe",
           "OK", "ERROR", "ABORTED", "DIED", "LIVENESS_PERIOD", "DIVERGE_GRACE", "lost_error"]

OK, ERROR, ABORTED, DIED = 0, 1, 2, 3         # reply status (the reply message's `a`)
LIVENESS_PERIOD = 0.5                        # seconds between checks that peers still live
DIVERGE_GRACE = 1.0                          # a finished peer's last data may still be in flight


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def encode(obj: Any) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    """Pickle `obj`, its contiguous arrays out of band (sent without a copy)."""
    bufs: List[pickle.PickleBuffer] = []
    meta = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return meta, [b.raw() for b in bufs]


def decode(msg: Message) -> Any:
    return pickle.loads(msg.meta, buffers=msg.bufs)


class _BufferPool:
    """Receive buffers for collective data, reused: `exchange` lends each one to the
    communicator until its next exchange (which consumes what it received before that)."""

    def __init__(self, keep: int = 4):
        self._free: Dict[int, List[np.ndarray]] = {}
        self._lent: List[np.ndarray] = []
        self._keep = keep

    def get(self, nbytes: int) -> np.ndarray:
        free = self._free.get(nbytes)
        return free.pop() if free else np.empty(nbytes, np.uint8)

    def put(self, buf: np.ndarray) -> None:
        free = self._free.setdefault(buf.nbytes, [])
        if len(free) < self._keep:
            free.append(buf)

    def lend(self, bufs: Iterable[np.ndarray]) -> None:
        self._lent.extend(bufs)

    def recycle(self) -> None:
        for buf in self._lent:
            self.put(buf)
        self._lent.clear()


class Endpoint:
    """Worker `index`'s links to the others, and what arrived through them."""

    def __init__(self, index: int, timeout: float):
        self.index = index
        self.timeout = timeout
        self.links: Dict[int, Link] = {}
        self._link_list: List[Link] = []
        self.procs: Dict[int, Tuple[str, int]] = {}     # worker -> (host name, pid)
        self.addresses: Dict[int, str] = {}             # worker -> its node's address
        self.what = ""                                  # what the members are ("Ray actor")
        self.host = socket.gethostname()
        self.buffers = _BufferPool()
        self._dtypes: Dict[bytes, np.dtype] = {}
        # what arrived
        self.data: Dict[Tuple[int, int, int, int], Tuple[np.ndarray, np.ndarray]] = {}
        self.replies: Dict[int, Message] = {}           # host: worker -> reply of current run
        self.commands: Deque[Message] = deque()         # workers: commands to run
        self.aborted: Dict[int, str] = {}               # run id -> reason
        self.finished: Dict[int, set] = {}              # run id -> workers that finished it
        self.bye = False
        self.byes: set = set()                          # peers that said goodbye
        self.failures: Dict[int, str] = {}              # origin -> failure notice (instances)
        self.outputs: Deque[Message] = deque()          # OUTPUT messages (a launcher's)
        self.run_id = 0
        self._last_liveness = time.monotonic()

    def add_link(self, link: Link) -> None:
        self.links[link.peer] = link
        self._link_list = [self.links[p] for p in sorted(self.links)]

    def detach_link(self, peer: int) -> Link:
        """Take the link to `peer` out of this endpoint (another thread will own it)."""
        link = self.links.pop(peer)
        self._link_list = [self.links[p] for p in sorted(self.links)]
        return link

    def alloc(self, kind: int, nbytes: int) -> np.ndarray:
        return self.buffers.get(nbytes) if kind == DATA else np.empty(nbytes, np.uint8)

    # --- moving bytes ------------------------------------------------------------------------
    def progress(self) -> bool:
        """Push queued messages and take in arrived ones on every link; True if anything moved."""
        moved = False
        for link in self._link_list:
            if link.progress(self._deliver):
                moved = True
        return moved

    def _deliver(self, m: Message) -> None:
        kind = m.kind
        if kind == DATA:
            if m.run_id < self.run_id:                 # a late arrival of an aborted run
                self.buffers.put(m.body)
                return
            dtype = self._dtypes.get(m.meta)
            if dtype is None:
                dtype = self._dtypes[m.meta] = np.dtype(m.meta.decode())
            self.data[(m.src, m.run_id, m.a, m.b)] = (m.bufs[0].view(dtype), m.body)
        elif kind == REPLY:
            self.replies[m.src] = m
        elif kind == CMD:
            self.commands.append(m)
        elif kind == ABORT:
            self.aborted[m.run_id] = m.meta.decode()
        elif kind == FIN:
            self.finished.setdefault(m.run_id, set()).add(m.a)
        elif kind == BYE:
            self.bye = True
            self.byes.add(m.src)
        elif kind == FAILED:
            self.failures.setdefault(m.a, m.meta.decode("utf-8", "replace"))
        elif kind == OUTPUT:
            self.outputs.append(m)

    def flush_all(self, workers: Iterable[int], deadline: Optional[float] = None,
                  stall: Optional[float] = None) -> bool:
        """Push every queued message to `workers` (reading meanwhile); False if one of them died
        or the deadline passed first. With `stall`, a worker whose link moves no byte for
        `stall` seconds raises CollectiveTimeout (it is stopped or hung)."""
        links = [self.links[w] for w in workers]
        silence = Silence(self, workers) if stall is not None else None
        backoff = Backoff()
        while not all(link.idle for link in links):
            if self.progress():
                backoff = Backoff()
                continue
            if any(link.dead for link in links) or self.dead_workers(
                    [link.peer for link in links], force=False):
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
            if silence is not None:
                quiet = silence.over(stall, [lk.peer for lk in links if not lk.idle])
                if quiet:
                    raise self.silent(quiet, stall, "took none of the bytes sent to it for "
                                                    "{t:g} s")
            backoff.wait()
        return True

    def silent(self, workers: Sequence[int], timeout: float, what: str) -> CollectiveTimeout:
        """The error for `workers` whose links stayed still for `timeout` seconds (`what`
        says what they did not do, with `{t}` for the timeout)."""
        who = ", ".join(f"worker {w} ({self.describe_member(w)})" for w in workers)
        err = CollectiveTimeout(f"{who} {what.format(t=timeout)} (stopped, hung, or far slower "
                                f"than the others; POPXL_COLLECTIVE_TIMEOUT)")
        err.workers, err.timeout = tuple(workers), timeout
        return err

    def start_run(self, run_id: int) -> None:
        """Forget what earlier (aborted) runs left behind."""
        self.run_id = run_id
        for key in [k for k in self.data if k[1] < run_id]:
            self.buffers.put(self.data.pop(key)[1])
        for d in (self.aborted, self.finished):
            for r in [r for r in d if r < run_id]:
                del d[r]

    # --- liveness ----------------------------------------------------------------------------
    def dead_workers(self, workers: Iterable[int], force: bool = True) -> List[int]:
        """Those of `workers` whose link broke (their host stopped answering, or the
        connection closed) or whose process (on this host) is gone. Process and socket checks
        run at most every LIVENESS_PERIOD seconds unless `force`. Safe in a watchdog thread
        with `force` (it reads no link)."""
        workers = list(workers)
        links = self.links
        dead = [w for w in workers if w in links and links[w].dead]
        now = time.monotonic()
        if force or now - self._last_liveness > LIVENESS_PERIOD:
            self._last_liveness = now
            for w in workers:
                if w in dead:
                    continue
                host, pid = self.procs.get(w, ("", 0))
                if host == self.host and pid and not process_alive(pid):
                    dead.append(w)
                elif w in links and links[w].probe():
                    dead.append(w)
        return sorted(dead)

    def describe_member(self, w: int) -> str:
        """How errors name member `w`'s process: what it is, its pid and host."""
        host, pid = self.procs.get(w, ("?", "?"))
        return f"{self.what + ', ' if self.what else ''}pid {pid} on {host}"

    def died(self, dead: Sequence[int], when: str = "", noun: str = "worker",
             suffix: str = "") -> WorkerDied:
        """The error for members found dead (`e.workers` lists them): `HostUnreachable` naming
        the host and every member on it when their links ended because the host stopped
        answering, else `WorkerDied`. `when` says what this member was doing, `suffix` what
        follows."""
        cut = [w for w in dead if w in self.links and self.links[w].unreachable]
        if cut:
            hosts = hosts_of(cut, self.procs, self.addresses)
            members = {w: (h, self.describe_member(w)) for w, (h, _) in self.procs.items()
                       if w != self.index}
            return host_unreachable(hosts, members, peer_timeout(), noun, when, suffix)
        who = ", ".join(f"{noun} {w} ({self.describe_member(w)})" for w in dead)
        err = WorkerDied(f"{who} died{' ' + when if when else ''}{suffix}")
        err.workers = list(dead)
        return err

    def close(self) -> None:
        for link in self._link_list:
            link.close()
        self.links.clear()
        self._link_list = []


class Silence:
    """When each of some peers' links last moved a byte (either way): `over(t)` names those
    still for more than `t` seconds."""

    def __init__(self, ep: Endpoint, peers: Iterable[int]):
        now = time.monotonic()
        self.ep = ep
        self.last = {p: (now, self._moved(p)) for p in peers}

    def _moved(self, p: int) -> int:
        link = self.ep.links.get(p)
        return link.sent + link.received if link is not None else 0

    def over(self, timeout: float, peers: Iterable[int]) -> List[int]:
        now = time.monotonic()
        quiet = []
        for p in peers:
            since, moved = self.last.get(p, (now, -1))
            current = self._moved(p)
            if current != moved:
                self.last[p] = (now, current)
            elif now - since > timeout:
                quiet.append(p)
        return quiet


class EndpointTransport(Transport):
    """Collective exchanges as DATA messages between workers. Each message carries the run id,
    the collective's tag and a per-peer sequence number (a collective may exchange twice with
    one peer)."""

    noun = "worker"                       # what the peers are called in errors

    def __init__(self, endpoint: Endpoint, on_wait: Callable[[int, Sequence[int]], bool]):
        self.ep = endpoint
        self._on_wait = on_wait           # raise if the run failed elsewhere; True if a waited
        self._sent: Dict[int, int] = {}   # peer is known to have finished the run
        self._received: Dict[int, int] = {}
        self.run_id = 0
        self.data_sent = {"shm": 0, "socket": 0}
        self._gone_since: Optional[float] = None

    def start_run(self, run_id: int) -> None:
        self.run_id = run_id
        self._sent.clear()
        self._received.clear()
        self.ep.start_run(run_id)

    def exchange(self, sends, recvs, tag):
        ep = self.ep
        run_id = self.run_id
        ep.buffers.recycle()
        for peer, arr in sends.items():
            seq = self._sent.get(peer, 0)
            self._sent[peer] = seq + 1
            arr = np.ascontiguousarray(arr)
            link = ep.links[peer]
            link.post(DATA, run_id, tag, seq, arr.dtype.str.encode(), (arr,))
            self.data_sent[link.kind] += arr.nbytes
        wanted = {}
        for p in recvs:
            seq = self._received.get(p, 0)
            self._received[p] = seq + 1
            wanted[p] = (p, run_id, tag, seq)
        send_links = [ep.links[p] for p in sends]
        # The timeout is for silence: of the peers this exchange still waits for, each one's
        # link moving no byte for that long (another peer's messages do not count).
        silence = Silence(ep, set(wanted) | set(sends))
        self._gone_since = None
        backoff = Backoff()
        while True:
            moved = ep.progress()
            missing = {p: key for p, key in wanted.items() if key not in ep.data}
            if not missing and all(link.idle for link in send_links):
                break
            if moved:
                backoff = Backoff()
                continue
            waiting = sorted(set(missing) | {lk.peer for lk in send_links if not lk.idle})
            self.check_wait(run_id, tag, waiting, missing)
            quiet = silence.over(ep.timeout, waiting)
            if quiet:
                noun = self.noun
                err = CollectiveTimeout(
                    f"{noun} {ep.index}: collective (tag {tag}) got no data from {noun}(s) "
                    f"{quiet} within {ep.timeout:g} s (POPXL_COLLECTIVE_TIMEOUT)")
                err.workers = tuple(quiet)             # the silent workers (the executor
                err.timeout = ep.timeout               # names their replicas and the op)
                raise err
            backoff.wait()
        got = {}
        for p, (n, dtype) in recvs.items():
            arr, buf = ep.data.pop(wanted[p])
            if arr.size != n or arr.dtype != dtype:
                raise WorkerError(
                    f"worker {ep.index}: collective (tag {tag}) expected {n} {np.dtype(dtype)} "
                    f"values from worker {p}, got {arr.size} {arr.dtype}: the replicas diverged")
            got[p] = arr
            ep.buffers.lend((buf,))
        return got

    def check_wait(self, run_id: int, tag: int, waiting: List[int],
                   missing: Dict[int, tuple]) -> None:
        """Raise if the exchange can no longer complete: the run was aborted, a peer it waits
        for finished the run without joining (after `DIVERGE_GRACE`) or died. `missing` maps
        the peers whose data has not arrived to the key it will arrive under."""
        ep = self.ep
        if run_id in ep.aborted:
            raise RunAborted(ep.aborted[run_id])
        if self._on_wait(run_id, waiting):
            self._gone_since = self._gone_since or time.monotonic()
            if time.monotonic() - self._gone_since > DIVERGE_GRACE:
                raise WorkerError(
                    f"worker {ep.index}: a peer among workers {waiting} finished the run "
                    f"without joining this collective (tag {tag}): the replicas diverged")
        dead = ep.dead_workers(waiting if ep.index == 0 else sorted({0, *waiting}), force=False)
        if dead:
            raise ep.died(dead, f"while worker {ep.index} waited in a collective (tag {tag})")


def lost_error(value: Any, suffix: str = "") -> WorkerDied:
    """The `WorkerDied` / `HostUnreachable` a worker reported with status DIED."""
    unreachable, text, workers, hosts = value
    err = (HostUnreachable if unreachable else WorkerDied)(text + suffix)
    err.workers = workers
    if unreachable:
        err.hosts, err.host = hosts, hosts[0] if hosts else ""
    return err


def serve(ep: Endpoint, handle: Callable[[str, int, int, Any], Any],
          special: Optional[Dict[str, Callable[[Any], Any]]] = None) -> str:
    """A worker's loop: run the host's commands (`handle(cmd, sid, run_id, payload)`, or
    `special[cmd](payload)`), reply, repeat. Returns why it stopped: "bye" or "host died"."""
    host = ep.links[0]
    backoff = Backoff()
    while True:
        moved = ep.progress()
        if ep.commands:
            m = ep.commands.popleft()
            status, value = OK, None
            try:
                cmd, sid, payload = decode(m)
                fn = (special or {}).get(cmd)
                value = fn(payload) if fn is not None else handle(cmd, sid, m.run_id, payload)
            except RunAborted as e:
                status, value = ABORTED, (message_of(e), flight_of(e))
            except WorkerDied as e:
                # Another worker died (or its host is unreachable) while this one waited for it:
                # the host reports that, not a failure of this worker.
                status, value = DIED, (isinstance(e, HostUnreachable), str(e),
                                       list(getattr(e, "workers", ())),
                                       list(getattr(e, "hosts", ())))
            except BaseException as e:  # noqa: BLE001 - reported to the host
                status, value = ERROR, (reported(e), flight_of(e))
                if os.environ.get("POPXL_DEBUG"):
                    traceback.print_exc()
            try:
                meta, bufs = encode(value)
            except Exception as e:  # noqa: BLE001 - an unpicklable result is a failure too
                status, (meta, bufs) = ERROR, encode((f"cannot send the result back: "
                                                      f"{describe(e)}", None))
            host.post(REPLY, m.run_id, status, 0, meta, bufs)
            if not ep.flush_all([0]):
                return "host died"
            backoff = Backoff()
            continue
        if ep.bye:
            return "bye"
        if ep.dead_workers([0], force=False):
            return "host died"
        if moved:
            backoff = Backoff()
        else:
            backoff.wait()
