"""Messages between two processes over a pair of byte pipes (`pipes.py`): the same framing on
shared-memory rings and on sockets, messages of any size (streamed through the pipe as it
drains), never blocking.

A message is a kind, a run id, two integers (`a`, `b`: e.g. a collective's tag and sequence
number), a `meta` byte string and any number of raw buffers. On the wire: a fixed header (with
the body's length), then the body: the buffer lengths, `meta`, and each buffer at a 64-byte
aligned offset. The receiver reads the body into one array it allocates (`alloc`) and hands out
the buffers as views of it: one copy, two reads for a whole message. Small messages leave in
one write.
"""
from __future__ import annotations

import struct
from collections import deque
from typing import Callable, Deque, List, NamedTuple, Sequence

import numpy as np

__all__ = ["Link", "Message", "CMD", "REPLY", "DATA", "ABORT", "FIN", "BYE", "OUTPUT", "FAILED",
           "KIND_NAMES"]

CMD, REPLY, DATA, ABORT, FIN, BYE, OUTPUT, FAILED = 1, 2, 3, 4, 5, 6, 7, 8
KIND_NAMES = {CMD: "command", REPLY: "reply", DATA: "data", ABORT: "abort", FIN: "finished",
              BYE: "bye", OUTPUT: "output", FAILED: "failed"}
# kind, number of buffers, run id, a, b, len(meta), len(body)
_HDR = struct.Struct("<IIqqqQQ")
_SMALL = 64 << 10          # messages up to this size are joined into one write
_PADS = [bytes(i) for i in range(64)]


def _aligned(n: int) -> int:
    return (n + 63) & ~63


def _layout(meta_len: int, lens: Sequence[int]) -> List[int]:
    """Offsets of the buffers in a body holding their lengths, `meta`, then the buffers."""
    offsets, off = [], _aligned(8 * len(lens) + meta_len)
    for n in lens:
        offsets.append(off)
        off = _aligned(off + n)
    return offsets


class Message(NamedTuple):
    kind: int
    src: int
    run_id: int
    a: int
    b: int
    meta: bytes
    bufs: List[np.ndarray]                # uint8 views of `body`
    body: np.ndarray                      # the uint8 array the message was received into


def _bytes_view(buf) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Link:
    """Messages to and from peer `peer` through `out` and `inp` (one object for a socket).
    `alloc(kind, nbytes)` gives the uint8 array a received message body is copied into."""

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

    @property
    def unreachable(self) -> bool:
        """Whether the link ended because the peer's host stopped answering."""
        return self.out.unreachable or self.inp.unreachable

    def probe(self) -> bool:
        """Whether the link has ended, from its pipes' state alone (reads nothing: safe beside
        the thread that uses the link)."""
        return self.out.probe() or self.inp.probe()

    # --- sending -----------------------------------------------------------------------------
    def post(self, kind: int, run_id: int, a: int = 0, b: int = 0, meta: bytes = b"",
             bufs: Sequence = ()) -> None:
        """Queue a message and push what the pipe takes now; `flush()` pushes the rest. The
        buffers are read until the message has left the queue: keep them unchanged until
        `flush()` returns True."""
        views = [_bytes_view(b_) for b_ in bufs]
        lens = [len(v) for v in views]
        offsets = _layout(len(meta), lens)
        body_len = offsets[-1] + lens[-1] if views else len(meta)
        parts: list = [_HDR.pack(kind, len(views), run_id, a, b, len(meta), body_len)]
        if views:
            parts.append(struct.pack(f"<{len(views)}Q", *lens))
        parts.append(meta)
        pos = 8 * len(views) + len(meta)
        for off, v in zip(offsets, views):
            parts.append(_PADS[off - pos])
            parts.append(v)
            pos = off + len(v)
        q = self._queue
        if body_len <= _SMALL:
            q.append(memoryview(b"".join(parts)))
        else:
            for part in parts:
                if len(part):
                    q.append(memoryview(part))
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

    def progress(self, deliver: Callable[[Message], None]) -> bool:
        """Push queued bytes, then read what has arrived (`deliver` each complete message);
        True if anything moved either way."""
        moved = False
        if self._queue:
            sent = self.sent
            self.flush()
            moved = self.sent != sent
        return self.pump(deliver) or moved

    # --- receiving ---------------------------------------------------------------------------
    def _start_message(self) -> None:
        self._hdr = bytearray(_HDR.size)
        self._target = memoryview(self._hdr)
        self._off = 0
        self._head = None                    # the parsed header while the body arrives

    def pump(self, deliver: Callable[[Message], None]) -> bool:
        """Read what has arrived; `deliver` each complete message. True if anything arrived."""
        inp = self.inp
        if not inp.readable():
            return False
        progressed = False
        while True:
            target, off = self._target, self._off
            if off < len(target):
                n = inp.readinto(target[off:])
                if not n:
                    return progressed
                progressed = True
                self.received += n
                self._off = off = off + n
                if off < len(target):
                    return progressed
            if self._head is None:
                head = self._head = _HDR.unpack(self._hdr)
                self._body = self._alloc(head[0], head[6])
                self._target = memoryview(self._body)
                self._off = 0
            else:
                self._deliver_body(deliver)

    def _deliver_body(self, deliver: Callable[[Message], None]) -> None:
        kind, nbufs, run_id, a, b, meta_len, _ = self._head
        body = self._body
        if nbufs:
            lens = struct.unpack_from(f"<{nbufs}Q", body)
            bufs = [body[off:off + n] for off, n in zip(_layout(meta_len, lens), lens)]
        else:
            bufs = []
        meta = body[8 * nbufs:8 * nbufs + meta_len].tobytes()
        self._start_message()
        deliver(Message(kind, self.peer, run_id, a, b, meta, bufs, body))

    def close(self) -> None:
        self.out.close()
        if self.inp is not self.out:
            self.inp.close()
