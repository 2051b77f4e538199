"""Building the links of a worker pool in three steps run by every worker (the host first):

1. `hello()`: open a listening socket; tell the others where it is and which node this is;
2. `connect(table)`: create a shared-memory ring towards each worker of the same node, and
   connect to the listener of each lower-numbered worker on another node;
3. `attach()`: map the rings the others created towards this worker, accept the connections of
   the higher-numbered workers of other nodes.

`finish()` then removes the rings' names (each process keeps its mapping), so nothing is left
in /dev/shm whatever happens to the processes later. Ring names start with the job's prefix,
which the host removes on every exit path, for failures between steps 2 and 3.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from typing import Dict, List, Optional

from .endpoint import Endpoint
from .links import Link
from .pipes import ShmRing, SocketPipe

__all__ = ["MeshMember", "RING_BYTES"]

RING_BYTES = 4 << 20            # per direction of a same-node pair
_INDEX = struct.Struct("<I")


class MeshMember:
    """Worker `endpoint.index`'s part in building the links of `size` workers."""

    def __init__(self, endpoint: Endpoint, job: str, token: bytes, size: int, node: str,
                 ip: str, use_shm: bool, ring_bytes: int = RING_BYTES):
        self.ep = endpoint
        self.me = endpoint.index
        self.job = job
        self.token = token
        self.size = size
        self.node = node
        self.ip = ip
        self.use_shm = use_shm
        self.ring_bytes = ring_bytes
        self.table: List[dict] = []
        self._listener: Optional[socket.socket] = None
        self._out: Dict[int, object] = {}        # peer -> pipe towards it
        self._in: Dict[int, object] = {}         # peer -> pipe from it
        self._created: List[ShmRing] = []

    def _ring_name(self, src: int, dst: int) -> str:
        return f"{self.job}-{src}-{dst}"

    def _shared_memory_with(self, peer: int) -> bool:
        me, other = self.table[self.me], self.table[peer]
        return me["node"] == other["node"] and me["shm"] and other["shm"]

    def hello(self) -> dict:
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((self.ip, 0))
        lst.listen(max(self.size, 8))
        self._listener = lst
        return {"node": self.node, "ip": self.ip, "port": lst.getsockname()[1],
                "host": socket.gethostname(), "pid": os.getpid(), "shm": self.use_shm}

    def connect(self, table: List[dict]) -> None:
        self.table = table
        self.ep.procs = {w: (t["host"], t["pid"]) for w, t in enumerate(table)}
        for peer in range(self.size):
            if peer == self.me:
                continue
            if self._shared_memory_with(peer):
                ring = ShmRing(self._ring_name(self.me, peer), self.ring_bytes, create=True)
                self._created.append(ring)
                self._out[peer] = ring
            elif peer < self.me:
                t = table[peer]
                sock = socket.create_connection((t["ip"], t["port"]), timeout=30)
                sock.sendall(self.token + _INDEX.pack(self.me))
                self._out[peer] = self._in[peer] = SocketPipe(sock)

    def attach(self, timeout: float = 60.0) -> None:
        expect = set()
        for peer in range(self.size):
            if peer == self.me:
                continue
            if self._shared_memory_with(peer):
                self._in[peer] = ShmRing(self._ring_name(peer, self.me), self.ring_bytes,
                                         create=False)
            elif peer > self.me:
                expect.add(peer)
        deadline = time.monotonic() + timeout
        while expect:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {self.me}: worker(s) {sorted(expect)} did not connect "
                                   f"within {timeout:g} s")
            self._listener.settimeout(left)
            conn, _ = self._listener.accept()
            peer = self._greeting(conn)
            if peer in expect:
                expect.discard(peer)
                self._out[peer] = self._in[peer] = SocketPipe(conn)
            else:
                conn.close()                     # not one of this job's workers
        self._listener.close()
        self._listener = None
        for peer in sorted(self._out):
            self.ep.add_link(Link(peer, self._out[peer], self._in[peer], self.ep.alloc))

    def _greeting(self, conn: socket.socket) -> int:
        """The worker index a new connection announces, or -1 if it does not know the token."""
        conn.settimeout(10)
        want = len(self.token) + _INDEX.size
        got = b""
        try:
            while len(got) < want:
                chunk = conn.recv(want - len(got))
                if not chunk:
                    return -1
                got += chunk
        except OSError:
            return -1
        if got[:len(self.token)] != self.token:
            return -1
        return _INDEX.unpack(got[len(self.token):])[0]

    def finish(self) -> None:
        """Remove the names of the rings this worker created (everyone has mapped them)."""
        for ring in self._created:
            ring.unlink()

    def abandon(self) -> None:
        """Undo a failed setup: close everything, remove this worker's ring names."""
        self.finish()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for pipe in {id(p): p for p in [*self._out.values(), *self._in.values()]}.values():
            pipe.close()
        self.ep.close()
