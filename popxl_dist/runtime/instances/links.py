"""Instances joined by the job's own links (`transport/mesh.py`: shared-memory rings on one node,
sockets between nodes, every connection proven with the job's token): the instance group of `popxl-run
--backend ray --instances N`, whose instances are Ray actors with no MPI between them.

The launcher builds the links before the script starts (passing addresses and the token as Ray
call arguments) and is a member of the mesh itself: `Uplink` carries the script's output to it
and its failure notices (an actor Ray saw die) to the instance, on a thread of its own. Between
instances, collective data, failure notices and goodbyes travel on one link per pair, in order:
a goodbye is never read before the data sent ahead of it, so a peer's goodbye means that the
data it has not sent will never come. Data of a later collective from a peer that still owes
this one's means the instances diverged. Waits check that the peers they wait for are alive (by
pid on this host; a socket to another node breaks when its process dies).
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Dict, List, Optional, Set

from ...errors import InstanceFailed, WorkerDied
from ..process.polling import Backoff
from ..transport.endpoint import Endpoint, EndpointTransport
from ..transport.links import BYE, FAILED, Link, Message
from ..transport.pipes import SocketPipe
from .group import ACK_GRACE, InstanceGroup

__all__ = ["LinkInstanceGroup", "Uplink"]


class Uplink:
    """An instance's link to its launcher, owned by a thread: `post` queues a message for the
    launcher (output, a failure notice, goodbye); failure notices from the launcher land in
    `failures` (origin -> message), those of instances whose actor died in `deaths`."""

    def __init__(self, link: Link):
        self.link = link
        self.failures: Dict[int, str] = {}
        self.deaths: Set[int] = set()
        self._queue: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="popxl-uplink", daemon=True)
        self._thread.start()

    def post(self, kind: int, a: int = 0, meta: bytes = b"") -> None:
        self._queue.put((kind, a, meta))

    def _deliver(self, m: Message) -> None:
        if m.kind == FAILED:
            if m.b:
                self.deaths.add(m.a)
            else:
                self.failures.setdefault(m.a, m.meta.decode("utf-8", "replace"))

    def _loop(self) -> None:
        link = self.link
        backoff = Backoff()
        while not link.dead:
            moved = False
            while True:
                try:
                    kind, a, meta = self._queue.get_nowait()
                except queue.Empty:
                    break
                link.post(kind, 0, a, 0, meta)
                moved = True
            if link.progress(self._deliver):
                moved = True
            if self._stop.is_set() and link.idle and self._queue.empty():
                return
            if moved:
                backoff = Backoff()
            else:
                backoff.wait()

    def close(self, timeout: float = 5.0) -> None:
        """Say goodbye to the launcher once everything queued has left; stop the thread."""
        self.post(BYE)
        self._stop.set()
        self._thread.join(timeout)
        _close_link(self.link)


def _close_link(link: Link) -> None:
    """Close a link without losing what it sent: a socket is shut down for writing first (a
    close with unread input would reset the connection and could drop the last bytes)."""
    pipe = link.out
    if isinstance(pipe, SocketPipe) and pipe.sock is not None:
        try:
            pipe.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        end = time.monotonic() + 0.5
        buf = bytearray(65536)
        while time.monotonic() < end and not pipe.dead:
            if not pipe.readinto(memoryview(buf)):
                time.sleep(0.005)
    link.close()


class _LinkTransport(EndpointTransport):
    """Collective exchanges between instances over their links (see module doc)."""

    noun = "instance"

    def __init__(self, group: "LinkInstanceGroup"):
        super().__init__(group.ep, lambda run_id, waiting: False)
        self.group = group

    def exchange(self, sends, recvs, tag):
        try:
            return super().exchange(sends, recvs, tag)
        except BaseException as e:
            self.group.mark_broken(e)      # a link may hold the rest of the failed exchange
            raise

    def check_wait(self, run_id: int, tag: int, waiting: List[int],
                   missing: Dict[int, tuple]) -> None:
        g, ep = self.group, self.ep
        g.raise_notice()
        for p in waiting:
            if p in missing:
                _, _, _, seq = missing[p]
                later = sorted(k for k in ep.data if k[0] == p and
                               (k[1] > run_id or (k[1] == run_id and k[3] >= seq)))
                if later:
                    _, prun, ptag, _ = later[0]
                    raise InstanceFailed(
                        f"instance {p} is in another collective (run {prun}, tag {ptag}) than "
                        f"instance {g.index} (run {run_id}, tag {tag}): the instances diverged "
                        f"(they must build the same programs and run them in the same order)", p)
            if p in ep.byes:
                raise InstanceFailed(f"instance {p} ended its script without joining this "
                                     f"collective (it exited): the instances diverged", p)
        dead = ep.dead_workers(waiting, force=False)
        if dead:
            ep.progress()                  # what a dead peer wrote before it died is still read
            g.raise_notice()
            left = [p for p in dead if p in ep.byes]
            if left:
                raise InstanceFailed(f"instance {left[0]} ended its script without joining this "
                                     f"collective (it exited): the instances diverged", left[0])
            still = [p for p in dead if p in missing and missing[p] not in ep.data
                     or not ep.links[p].idle]
            if still:
                raise g.died(still)


class LinkInstanceGroup(InstanceGroup):
    """The instances of a Ray launch, over the links built before the script started.

    Args:
        index, size: this instance and the number of instances (the launcher is member `size`
            of the mesh, on `uplink`).
        endpoint: this instance's endpoint, with a link to every other instance.
        uplink: the link to the launcher, or None (tests).
    """

    name = "links"

    def __init__(self, index: int, size: int, endpoint: Endpoint,
                 uplink: Optional[Uplink] = None):
        super().__init__(index, size)
        self.ep = endpoint
        endpoint.timeout = self.timeout
        self.uplink = uplink
        self.transport = _LinkTransport(self)

    def next_run(self) -> int:
        run = super().next_run()
        self.transport.start_run(run)
        return run

    def raise_notice(self) -> None:
        """Raise InstanceFailed if an instance failed (its own notice, or the launcher's), or
        WorkerDied if the launcher saw its actor die (what the link closing would raise)."""
        notices = dict(self.uplink.failures) if self.uplink is not None else {}
        deaths = set(self.uplink.deaths) if self.uplink is not None else set()
        notices.update(self.ep.failures)
        if notices or deaths:
            origin = min(set(notices) | deaths)
            if origin in deaths and origin not in self.ep.failures:
                raise self.died([origin])
            raise InstanceFailed(f"instance {origin} failed: {notices[origin]}", origin)

    def died(self, dead: List[int]) -> WorkerDied:
        """WorkerDied naming the dead instances, or HostUnreachable naming their host and the
        instances on it."""
        err = self.ep.died(dead, noun="instance")
        err.instance = err.workers[0] if err.workers else dead[0]
        return err

    # --- ending ---------------------------------------------------------------------------
    def _tell_all(self, kind: int, a: int, meta: bytes) -> None:
        """Post a notice to every other instance and push it out (bounded by `ACK_GRACE`)."""
        ep = self.ep
        for p in self.peers:
            if p in ep.links and not ep.links[p].dead:
                ep.links[p].post(kind, self.run_id, a, 0, meta)
        deadline = time.monotonic() + ACK_GRACE
        backoff = Backoff()
        while time.monotonic() < deadline:
            links = [lk for lk in ep.links.values() if not lk.dead]
            if all(lk.idle for lk in links):
                break
            if ep.progress():
                backoff = Backoff()
            else:
                backoff.wait()

    def _close_links(self) -> None:
        for link in list(self.ep.links.values()):
            _close_link(link)
        self.ep.links.clear()
        self.ep.close()

    def fail(self, message: str, origin: int) -> bool:
        if self.closed:
            return True
        self.closed = True
        meta = message.encode("utf-8", "replace")
        if self.uplink is not None:
            self.uplink.post(FAILED, origin, meta)
        self._tell_all(FAILED, origin, meta)
        self._close_links()
        return True              # the launcher stops whoever does not take notice

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._tell_all(BYE, self.index, b"")
        self._close_links()
