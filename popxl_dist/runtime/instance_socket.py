"""Instances connected by TCP sockets, introduced by the launcher's hub (`hub.py`): the instance
group of `popxl-run --backend ray --instances N`, where the instances are Ray actors (possibly on
several nodes) with no MPI between them.

Every pair of instances shares one connection. Each message is a header (magic, run id, collective
tag, byte count) and the raw bytes; the receiver checks the header against what it expects, so an
instance in another run or collective is reported as diverged at once. Sends and receives of one
exchange progress together on non-blocking sockets (no deadlock on large arrays). Waits watch the
hub connection too: a failure notice relayed by the hub raises `InstanceFailed` naming the
instance, and a peer whose connection closes while it still owes data is reported as gone.

(The `ray` helper is rebuilding the Ray backend's transport, shared memory on a node and sockets
across nodes, at the same time; this transport implements the same `Transport` interface and can
be swapped for it.)
"""
from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..engine.comm import Transport
from ..errors import CollectiveTimeout, InstanceFailed
from .hub import LineReader, send_message
from .instance_group import InstanceGroup

__all__ = ["SocketInstanceGroup", "SocketTransport"]

_HDR = struct.Struct("<4sIIQ")      # magic, run id (mod 2**32), tag, payload bytes
_MAGIC = b"PXL1"
_POLL = 0.5                          # seconds between deadline checks while nothing happens


def _describe_header(run: int, tag: int) -> str:
    return f"run {run}, tag {tag}"


class _Incoming:
    """One expected message from one peer: header first, then the payload in place."""

    __slots__ = ("header", "hpos", "body", "view", "pos")

    def __init__(self, n: int, dtype):
        self.header = bytearray(_HDR.size)
        self.hpos = 0
        self.body = np.empty(n, dtype)
        self.view = memoryview(self.body.view(np.uint8).reshape(-1))
        self.pos = 0


class SocketTransport(Transport):
    """Collective exchanges over the group's peer connections."""

    def __init__(self, group: "SocketInstanceGroup"):
        self.group = group
        self.run_id = 0

    def exchange(self, sends, recvs, tag):
        try:
            return self._exchange(sends, recvs, tag)
        except BaseException as e:
            self.group.mark_broken(e)      # a stream may be left mid-message
            raise

    def _exchange(self, sends, recvs, tag):
        g = self.group
        run = self.run_id & 0xFFFFFFFF
        out: Dict[int, List[memoryview]] = {}
        for p, arr in sends.items():
            a = np.ascontiguousarray(arr).reshape(-1)
            out[p] = [memoryview(_HDR.pack(_MAGIC, run, tag, a.nbytes)),
                      memoryview(a.view(np.uint8))]
        inc = {p: _Incoming(n, dtype) for p, (n, dtype) in recvs.items()}
        got: Dict[int, np.ndarray] = {}
        deadline = time.monotonic() + g.timeout
        while out or inc:
            moved = False
            for p in list(out):
                moved |= self._send_some(p, out)
            for p in list(inc):
                moved |= self._recv_some(p, inc, got, run, tag)
            if not (out or inc):
                break
            if moved:                   # the deadline is for silence, not for the whole transfer
                deadline = time.monotonic() + g.timeout
                continue
            g.read_hub()
            left = deadline - time.monotonic()
            if left <= 0:
                silent = sorted(inc) or sorted(out)
                err = CollectiveTimeout(
                    f"instance {g.index}: collective (tag {tag}) got no data from instance(s) "
                    f"{silent} within {g.timeout:g} s (POPXL_COLLECTIVE_TIMEOUT)")
                err.workers, err.timeout = tuple(silent), g.timeout
                raise err
            rlist = [g.socks[p] for p in inc] + [g.hub]
            wlist = [g.socks[p] for p in out]
            select.select(rlist, wlist, [], min(left, _POLL))
        return got

    def _send_some(self, p: int, out: Dict[int, List[memoryview]]) -> bool:
        parts = out[p]
        sock = self.group.socks[p]
        moved = False
        while parts:
            try:
                n = sock.sendmsg(parts)        # header and payload in one call (one segment)
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                self.group.peer_gone(p, f"send: {e}")
            moved = True
            while parts and n >= len(parts[0]):        # (empty payloads are done at once)
                n -= len(parts.pop(0))
            if n:
                parts[0] = parts[0][n:]
        del out[p]
        return True

    def _recv_some(self, p: int, inc: Dict[int, "_Incoming"], got: Dict[int, np.ndarray],
                   run: int, tag: int) -> bool:
        m = inc[p]
        sock = self.group.socks[p]
        moved = False
        while True:
            try:
                if m.hpos < _HDR.size:
                    n = sock.recv_into(memoryview(m.header)[m.hpos:])
                elif m.pos < len(m.view):
                    n = sock.recv_into(m.view[m.pos:])
                else:
                    break
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                self.group.peer_gone(p, f"receive: {e}")
            if n == 0:
                self.group.peer_gone(p, "closed")
            moved = True
            if m.hpos < _HDR.size:
                m.hpos += n
                if m.hpos == _HDR.size:
                    self._check_header(p, m, run, tag)
            else:
                m.pos += n
        got[p] = m.body
        del inc[p]
        return True

    def _check_header(self, p: int, m: "_Incoming", run: int, tag: int) -> None:
        magic, prun, ptag, nbytes = _HDR.unpack(bytes(m.header))
        g = self.group
        if magic != _MAGIC:
            raise InstanceFailed(f"instance {g.index}: garbage from instance {p} (bad magic "
                                 f"{magic!r})", p)
        if (prun, ptag) != (run, tag):
            raise InstanceFailed(
                f"instance {p} is in another collective ({_describe_header(prun, ptag)}) than "
                f"instance {g.index} ({_describe_header(run, tag)}): the instances diverged "
                f"(they must build the same programs and run them in the same order)", p)
        if nbytes != len(m.view):
            raise InstanceFailed(
                f"instance {g.index}: collective (tag {tag}) expected {len(m.view)} bytes from "
                f"instance {p}, got {nbytes}: the instances diverged", p)


class SocketInstanceGroup(InstanceGroup):
    """The instances of a hub launch (`POPXL_INSTANCE_HUB=host:port`)."""

    name = "socket"

    def __init__(self, index: int, size: int, hub: str):
        super().__init__(index, size)
        host, _, port = hub.rpartition(":")
        self.hub = socket.create_connection((host, int(port)), timeout=self.timeout)
        self.hub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = LineReader()
        self.socks: Dict[int, socket.socket] = {}
        listener = socket.create_server(("0.0.0.0", 0), backlog=size)
        try:
            me = self.hub.getsockname()[0]
            send_message(self.hub, {"kind": "register", "index": index, "host": me,
                                    "port": listener.getsockname()[1], "pid": os.getpid()})
            self.hub.setblocking(False)
            peers = self._wait_for_peers()
            self._connect(listener, peers)
        finally:
            listener.close()
        for s in self.socks.values():
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = SocketTransport(self)

    # --- set-up ---------------------------------------------------------------------------
    def _wait(self, sock: Optional[socket.socket], what: str, deadline: float) -> None:
        """Wait until `sock` is readable (or just for hub messages), raising on failure
        notices and at the deadline."""
        while True:
            self.read_hub()
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeout(f"instance {self.index}: {what} within {self.timeout:g} s"
                                        f" (POPXL_COLLECTIVE_TIMEOUT)")
            rlist = [self.hub] + ([sock] if sock is not None else [])
            ready, _, _ = select.select(rlist, [], [], min(left, _POLL))
            if sock is not None and sock in ready:
                return
            if sock is None and self._peers is not None:
                return

    _peers: Optional[List[Tuple[str, int]]] = None

    def _wait_for_peers(self) -> List[Tuple[str, int]]:
        deadline = time.monotonic() + self.timeout
        self._wait(None, "the other instances did not start their popdist Session", deadline)
        return self._peers

    def _connect(self, listener: socket.socket, peers: List[Tuple[str, int]]) -> None:
        deadline = time.monotonic() + self.timeout
        for j in range(self.index + 1, self.size):
            s = socket.create_connection(tuple(peers[j]), timeout=self.timeout)
            s.sendall(struct.pack("<I", self.index))
            self.socks[j] = s
        while len(self.socks) < self.size - 1:
            self._wait(listener, f"instances {sorted(set(range(self.index)) - set(self.socks))}"
                                 f" did not connect", deadline)
            conn, _ = listener.accept()
            conn.settimeout(self.timeout)
            raw = b""
            while len(raw) < 4:
                chunk = conn.recv(4 - len(raw))
                if not chunk:
                    break
                raw += chunk
            if len(raw) == 4:
                self.socks[struct.unpack("<I", raw)[0]] = conn

    # --- notices --------------------------------------------------------------------------
    def read_hub(self) -> None:
        """Take the hub's messages; raise InstanceFailed on a failure notice."""
        while True:
            try:
                data = self.hub.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                raise InstanceFailed(f"instance {self.index}: the launcher's hub closed the "
                                     f"connection (the launch is ending)", -1)
            for msg in self._reader.feed(data):
                if msg.get("kind") == "peers":
                    self._peers = [tuple(p) for p in msg["peers"]]
                elif msg.get("kind") == "failed":
                    origin = int(msg["origin"])
                    raise InstanceFailed(f"instance {origin} failed: {msg['message']}", origin)

    def peer_gone(self, peer: int, what: str) -> None:
        """Raise for a peer whose connection broke (a failure notice says more, if any)."""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:        # the hub's notice may be on its way
            self.read_hub()
            select.select([self.hub], [], [], 0.05)
        raise InstanceFailed(f"instance {peer}'s connection broke ({what}) while instance "
                             f"{self.index} needed its data: it exited or died", peer)

    # --- ending ---------------------------------------------------------------------------
    def _say(self, msg: dict) -> None:
        try:
            self.hub.setblocking(True)
            send_message(self.hub, msg)
        except OSError:
            pass

    def _close_sockets(self) -> None:
        for s in list(self.socks.values()) + [self.hub]:
            try:
                s.close()
            except OSError:
                pass

    def fail(self, message: str, origin: int) -> bool:
        if self.closed:
            return True
        self.closed = True
        self._say({"kind": "failed", "origin": origin, "message": message})
        self._close_sockets()
        return True              # the launcher stops whoever does not take notice

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._say({"kind": "bye", "index": self.index})
        self._close_sockets()
