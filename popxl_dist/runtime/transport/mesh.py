"""Building the links between the processes of one job in three steps run by every member (the
coordinator passes each step's inputs as call arguments: Ray actor calls, or the threads of a
test):

1. `hello()`: say which node this is (and open a listening socket if some member will connect
   here: `listen` is None on one node with shared memory, the loopback address on one node
   without it, the node's address only when the job spans nodes);
2. `connect(table)`: create a shared-memory ring towards each member of the same node, connect
   to the listener of each lower-numbered member reached by socket and send it this member's
   proof (below);
3. `attach()`: map the rings the others created towards this member; accept the connections of
   the higher-numbered members and answer their proofs; check the answers to this member's.

Only the job's members can join. The coordinator hands every member a random per-job `token`
(as a call argument, never through the environment or a file). A socket peer proves it knows the
token without sending it: the connecting member sends its index, a fresh nonce and
HMAC-SHA256(token, ...) over the job, both indices and the nonce; the listening member checks it
in constant time (`hmac.compare_digest`) and answers with its own HMAC over the same nonce, which
the connecting member checks before it reads anything else. A connection that sends anything
else, or nothing within `HANDSHAKE_TIMEOUT`, is closed; connections are served side by side
(non-blocking, one deadline each), so a stalled or hostile one cannot hold up the others. Rings
are files in /dev/shm created `O_EXCL` with mode 0600 (only the job's user can open them) under
unguessable names, checked for owner and mode when attached, and unlinked by `finish()` once
every member has mapped them, so nothing is left in /dev/shm whatever happens to the processes
later. Ring names start with the job's prefix, which the coordinator removes on every exit path,
for failures between steps 2 and 3.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import select
import socket
import struct
import time
from typing import Dict, List, Optional

from .endpoint import Endpoint
from .links import Link
from .pipes import ShmRing, SocketPipe

__all__ = ["MeshMember", "RING_BYTES", "HANDSHAKE_TIMEOUT", "listen_address", "new_token",
           "proof", "MAGIC", "HELLO", "ANSWER"]

RING_BYTES = 4 << 20            # per direction of a same-node pair
HANDSHAKE_TIMEOUT = 10.0        # seconds a new connection has to prove itself
MAX_PENDING = 32                # unproven connections kept at once (the oldest is dropped)
MAGIC = b"PXLMESH1"
_NONCE = 16
HELLO = struct.Struct(f"<8sII{_NONCE}s32s")     # magic, from, to, nonce, proof
ANSWER = struct.Struct("<32s")                  # the listener's proof over the same nonce


def new_token() -> bytes:
    """A job's secret."""
    return secrets.token_bytes(32)


def proof(token: bytes, role: bytes, job: str, src: int, dst: int, nonce: bytes) -> bytes:
    """HMAC-SHA256 of one side's handshake message (`role` b"connect" or b"accept")."""
    msg = b"\0".join([role, job.encode(), struct.pack("<II", src, dst), nonce])
    return hmac.new(token, msg, hashlib.sha256).digest()


def listen_address(spans_nodes: bool, use_shm: bool, node_ip: str) -> Optional[str]:
    """Where a member listens: nowhere on one node with shared memory, on the loopback on one
    node without it, on the node's address only when the job spans nodes."""
    if spans_nodes:
        return node_ip
    return None if use_shm else "127.0.0.1"


class _Pending:
    """An accepted connection that has not proven itself yet."""

    __slots__ = ("sock", "deadline", "got")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline
        self.got = b""


class MeshMember:
    """Member `endpoint.index`'s part in building the links of `size` members (see module doc).

    Args:
        endpoint: this member's endpoint (the links are added to it).
        job: the job's name: prefix of its ring names, part of every proof.
        token: the job's secret (`new_token()`).
        size: the number of members.
        node: this member's node (members of one node with `use_shm` talk through rings).
        ip: the address of this node others connect to (when `listen` is not None).
        use_shm: whether this member can use shared-memory rings.
        listen: the address to listen on (`listen_address`), or None for no listener.
    """

    def __init__(self, endpoint: Endpoint, job: str, token: bytes, size: int, node: str,
                 ip: str, use_shm: bool, listen: Optional[str] = None,
                 ring_bytes: int = RING_BYTES):
        self.ep = endpoint
        self.me = endpoint.index
        self.job = job
        self.token = token
        self.size = size
        self.node = node
        self.ip = ip
        self.use_shm = use_shm
        self.listen = listen
        self.ring_bytes = ring_bytes
        self.table: List[dict] = []
        self._listener: Optional[socket.socket] = None
        self._out: Dict[int, object] = {}        # peer -> pipe towards it
        self._in: Dict[int, object] = {}         # peer -> pipe from it
        self._created: List[ShmRing] = []
        self._nonces: Dict[int, bytes] = {}      # lower peer -> nonce of this member's hello
        self._dialled: Dict[int, socket.socket] = {}

    def _ring_name(self, src: int, dst: int) -> str:
        return f"{self.job}-{src}-{dst}"

    def _shared_memory_with(self, peer: int) -> bool:
        me, other = self.table[self.me], self.table[peer]
        return me["node"] == other["node"] and me["shm"] and other["shm"]

    # --- 1 --------------------------------------------------------------------------------------
    def hello(self) -> dict:
        port = 0
        if self.listen is not None:
            lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lst.bind((self.listen, 0))
            lst.listen(128)
            lst.setblocking(False)
            self._listener = lst
            port = lst.getsockname()[1]
        return {"node": self.node, "ip": self.listen or self.ip, "port": port,
                "host": socket.gethostname(), "pid": os.getpid(), "shm": self.use_shm}

    # --- 2 --------------------------------------------------------------------------------------
    def connect(self, table: List[dict]) -> None:
        self.table = table
        self.ep.procs = {w: (t["host"], t["pid"]) for w, t in enumerate(table)}
        self.ep.addresses = {w: t["ip"] for w, t in enumerate(table)}
        for peer in range(self.size):
            if peer == self.me:
                continue
            if self._shared_memory_with(peer):
                ring = ShmRing(self._ring_name(self.me, peer), self.ring_bytes, create=True)
                self._created.append(ring)
                self._out[peer] = ring
            elif peer < self.me:
                t = table[peer]
                if not t["port"]:
                    raise RuntimeError(f"member {self.me}: member {peer} on node {t['node']} "
                                       f"does not listen (the coordinator placed the job on "
                                       f"one node)")
                # Started here, completed in attach(): a listener whose backlog an outsider
                # filled cannot block this step (the connection completes once it accepts).
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                err = sock.connect_ex((t["ip"], t["port"]))
                if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                    sock.close()
                    raise ConnectionError(f"member {self.me}: cannot connect to member {peer} "
                                          f"at {t['ip']}:{t['port']}: {os.strerror(err)}")
                self._nonces[peer] = secrets.token_bytes(_NONCE)
                self._dialled[peer] = sock

    # --- 3 --------------------------------------------------------------------------------------
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
        dialling = set(self._dialled)                 # lower peers being connected to
        answers = {p: b"" for p in self._dialled}     # lower peers whose answer is due
        pending: List[_Pending] = []
        try:
            while expect or answers:
                now = time.monotonic()
                if now > deadline:
                    missing = sorted(expect | set(answers))
                    raise TimeoutError(f"member {self.me}: member(s) {missing} did not complete "
                                       f"the handshake within {timeout:g} s")
                for p in [p for p in pending if p.deadline < now]:
                    pending.remove(p)           # a stalled connection: dropped, nobody waited
                    p.sock.close()
                rlist: list = [self._dialled[p] for p in answers if p not in dialling]
                wlist = [self._dialled[p] for p in dialling]
                if expect and self._listener is not None:
                    rlist.append(self._listener)
                rlist += [p.sock for p in pending]
                wait = min([deadline] + [p.deadline for p in pending]) - now
                ready, writable, _ = select.select(rlist, wlist, [], max(0.0, min(wait, 1.0)))
                for sock in writable:
                    peer = next(p for p in dialling if sock is self._dialled[p])
                    self._send_hello(peer)
                    dialling.discard(peer)
                for sock in ready:
                    if sock is self._listener:
                        self._accept(pending)
                    elif any(sock is self._dialled[p] for p in answers):
                        peer = next(p for p in answers if sock is self._dialled[p])
                        if self._read_answer(peer, answers):
                            del answers[peer]
                    else:
                        entry = next(p for p in pending if p.sock is sock)
                        peer = self._read_hello(entry, expect)
                        if peer is not None or entry.sock.fileno() < 0:
                            pending.remove(entry)
                        if peer is not None:
                            expect.discard(peer)
        finally:
            for p in pending:
                p.sock.close()
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        for peer, sock in self._dialled.items():
            sock.settimeout(None)
            self._out[peer] = self._in[peer] = SocketPipe(sock)
        self._dialled = {}
        for peer in sorted(self._out):
            self.ep.add_link(Link(peer, self._out[peer], self._in[peer], self.ep.alloc))

    def _send_hello(self, peer: int) -> None:
        """The connection to `peer` completed: send this member's proof."""
        sock = self._dialled[peer]
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise ConnectionError(f"member {self.me}: cannot connect to member {peer}: "
                                  f"{os.strerror(err)}")
        nonce = self._nonces[peer]
        sock.setblocking(True)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        sock.sendall(HELLO.pack(MAGIC, self.me, peer, nonce, proof(
            self.token, b"connect", self.job, self.me, peer, nonce)))

    def _accept(self, pending: List[_Pending]) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        if len(pending) >= MAX_PENDING:
            oldest = pending.pop(0)
            oldest.sock.close()
        pending.append(_Pending(conn, time.monotonic() + HANDSHAKE_TIMEOUT))

    def _read_hello(self, entry: _Pending, expect: set) -> Optional[int]:
        """Read what a new connection sent; its member index once it has proven the token (the
        connection then becomes the link to it), None while incomplete. A connection that
        fails the check is closed."""
        try:
            chunk = entry.sock.recv(HELLO.size - len(entry.got))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk:
            entry.sock.close()
            return None
        entry.got += chunk
        if len(entry.got) < HELLO.size:
            if not MAGIC.startswith(entry.got[:len(MAGIC)]):
                entry.sock.close()               # not one of ours: no need to wait for more
            return None
        magic, src, dst, nonce, got = HELLO.unpack(entry.got)
        want = proof(self.token, b"connect", self.job, src, self.me, nonce)
        if magic != MAGIC or dst != self.me or not hmac.compare_digest(got, want) \
                or src not in expect:
            entry.sock.close()                   # unknown token, a replay, or a stranger
            return None
        try:
            entry.sock.setblocking(True)
            entry.sock.settimeout(HANDSHAKE_TIMEOUT)
            entry.sock.sendall(ANSWER.pack(proof(self.token, b"accept", self.job, src, self.me,
                                                 nonce)))
            entry.sock.settimeout(None)
        except OSError:
            entry.sock.close()
            return None
        self._out[src] = self._in[src] = SocketPipe(entry.sock)
        return src

    def _read_answer(self, peer: int, answers: Dict[int, bytes]) -> bool:
        """Read the listener's answer on the connection to `peer`; True once it proved the
        token. Raises if it is wrong or the connection closed."""
        sock = self._dialled[peer]
        chunk = sock.recv(ANSWER.size - len(answers[peer]))
        if not chunk:
            raise ConnectionError(f"member {self.me}: member {peer} closed the connection "
                                  f"during the handshake")
        answers[peer] += chunk
        if len(answers[peer]) < ANSWER.size:
            return False
        want = proof(self.token, b"accept", self.job, self.me, peer, self._nonces[peer])
        if not hmac.compare_digest(answers[peer], want):
            raise ConnectionError(f"member {self.me}: the listener at member {peer}'s address "
                                  f"did not prove the job's token")
        return True

    def finish(self) -> None:
        """Remove the names of the rings this member created (everyone has mapped them)."""
        for ring in self._created:
            ring.unlink()

    def abandon(self) -> None:
        """Undo a failed setup: close everything, remove this member's ring names."""
        self.finish()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for sock in self._dialled.values():
            sock.close()
        self._dialled = {}
        for pipe in {id(p): p for p in [*self._out.values(), *self._in.values()]}.values():
            pipe.close()
        self.ep.close()
