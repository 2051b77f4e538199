"""Messages between two processes over a pair of byte pipes (`pipes.py`): the same framing on
shared-memory rings and on sockets, messages of any size (streamed through the pipe as it
drains), never blocking.

A message is a kind, a run id, two integers (`a`, `b`: e.g. a collective's tag and sequence
number), a `meta` byte string and any number of raw buffers. On the wire: a fixed header, the
buffer lengths, `meta`, then each buffer. The receiver copies each buffer straight into memory
it allocated for it (`alloc`), once.
"""
from __future__ import annotations

import struct
from collections import deque
from typing import Callable, Deque, List, NamedTuple, Sequence

import numpy as np

__all__ = ["Link", "Message", "CMD", "REPLY", "DATA", "ABORT", "FIN", "BYE", "KIND_NAMES"]

CMD, REPLY, DATA, ABORT, FIN, BYE = 1, 2, 3, 4, 5, 6
KIND_NAMES = {CMD: "command", REPLY: "reply", DATA: "data", ABORT: "abort", FIN: "finished",
              BYE: "bye"}
_HDR = struct.Struct("<IIqqqQ")           # kind, number of buffers, run id, a, b, len(meta)


class Message(NamedTuple):
    kind: int
    src: int
    run_id: int
    a: int
    b: int
    meta: bytes
    bufs: List[np.ndarray]                # uint8 arrays


def _bytes_view(buf) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Link:
    """Messages to and from peer `peer` through `out` and `inp` (one object for a socket).
    `alloc(kind, nbytes)` gives the uint8 array a received buffer is copied into."""

    def __init__(self, peer: int, out, inp, alloc: Callable[[int, int], np.ndarray]):
        self.peer = peer
        self.out = out
        self.inp = inp
        self.kind = out.kind
        self._alloc = alloc
        self._queue: Deque[memoryview] = deque()
        self.sent = 0                       # payload bytes handed to the pipe
        self.received = 0
        self._start_message()

    @property
    def dead(self) -> bool:
        return self.out.dead or self.inp.dead

    # --- sending -----------------------------------------------------------------------------
    def post(self, kind: int, run_id: int, a: int = 0, b: int = 0, meta: bytes = b"",
             bufs: Sequence = ()) -> None:
        """Queue a message and push what the pipe takes now; `flush()` pushes the rest. The
        buffers are read until the message has left the queue: keep them unchanged until
        `flush()` returns True."""
        views = [_bytes_view(b_) for b_ in bufs]
        head = _HDR.pack(kind, len(views), run_id, a, b, len(meta))
        if views:
            head += struct.pack(f"<{len(views)}Q", *(len(v) for v in views))
        q = self._queue
        q.append(memoryview(head))
        if meta:
            q.append(memoryview(meta))
        for v in views:
            if len(v):
                q.append(v)
        self.flush()

    def flush(self) -> bool:
        """Push queued bytes into the pipe; True when nothing is left to send."""
        q = self._queue
        write = self.out.write
        while q:
            view = q[0]
            n = write(view)
            if n == 0:
                return False
            self.sent += n
            if n == len(view):
                q.popleft()
            else:
                q[0] = view[n:]
        return True

    @property
    def idle(self) -> bool:
        return not self._queue

    # --- receiving ---------------------------------------------------------------------------
    def _start_message(self) -> None:
        self._hdr = bytearray(_HDR.size)
        self._targets: List[memoryview] = [memoryview(self._hdr)]
        self._ti = 0
        self._off = 0
        self._stage = 0                      # 0: header, 1: buffer lengths, 2: meta + buffers
        self._bufs: List[np.ndarray] = []
        self._meta = b""

    def pump(self, deliver: Callable[[Message], None]) -> bool:
        """Read what has arrived; `deliver` each complete message. True if anything arrived."""
        inp = self.inp
        if not inp.readable():
            return False
        progressed = False
        while True:
            target = self._targets[self._ti]
            n = inp.readinto(target[self._off:]) if self._off < len(target) else 0
            if n:
                progressed = True
                self.received += n
                self._off += n
            if self._off < len(target):
                return progressed
            self._ti += 1
            self._off = 0
            if self._ti == len(self._targets) and self._next_stage(deliver):
                progressed = True

    def _next_stage(self, deliver: Callable[[Message], None]) -> bool:
        """The current part is complete: set up the next one; True if a message was delivered."""
        if self._stage == 0:
            kind, nbufs, run_id, a, b, meta_len = _HDR.unpack(self._hdr)
            self._head = (kind, run_id, a, b)
            self._meta_len = meta_len
            if nbufs:
                self._lens = bytearray(8 * nbufs)
                self._targets, self._ti, self._stage = [memoryview(self._lens)], 0, 1
                return False
            lens: Sequence[int] = ()
        elif self._stage == 1:
            lens = struct.unpack(f"<{len(self._lens) // 8}Q", self._lens)
        else:
            kind, run_id, a, b = self._head
            msg = Message(kind, self.peer, run_id, a, b, bytes(self._meta), self._bufs)
            self._start_message()
            deliver(msg)
            return True
        kind = self._head[0]
        self._meta = bytearray(self._meta_len)
        self._bufs = [self._alloc(kind, n) for n in lens]
        self._targets = [memoryview(self._meta)] + [memoryview(b_) for b_ in self._bufs]
        self._ti, self._stage = 0, 2
        return False

    def close(self) -> None:
        self.out.close()
        if self.inp is not self.out:
            self.inp.close()
