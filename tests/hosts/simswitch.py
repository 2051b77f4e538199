"""The simulated hosts' network: a user-space Ethernet switch between their links, which can
delay and drop frames (this machine's kernel has no `netem` qdisc to do it).

    python simswitch.py IFACE [IFACE ...]

It opens a raw packet socket on each interface (the switch-side ends of the hosts' veth pairs),
learns which port each MAC address is behind, and forwards every frame a host sends to the port
of its destination (to every other port while unknown). With `PACKET_VNET_HDR`, a TCP burst
the kernel has not cut into segments yet (GSO) travels as one frame and is cut on delivery, so
a switch in Python forwards several hundred MB/s.

Shaping applies to each frame as it leaves the host that sent it, as `netem` on every host's
interface would: a frame is held `delay` seconds (one way: a round trip between two hosts is
twice that), and dropped with probability `loss` (a GSO burst counts as one frame).

Control: one command per line on stdin, one answer line on stdout:
    shape DELAY LOSS   set the delay (seconds) and the loss rate (0..1)   -> ok
    stats              -> stats FORWARDED DROPPED
End of stdin ends the switch (so it never outlives the fixture that started it).
"""
from __future__ import annotations

import heapq
import os
import random
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
VNET_HDR = 10                    # struct virtio_net_hdr, in front of every frame


class Switch:
    def __init__(self, ifaces, seed: int = 0):
        self.ports = []
        for name in ifaces:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.bind((name, 0))
            s.setblocking(False)
            self.ports.append(s)
        self.port_of = {s.fileno(): k for k, s in enumerate(self.ports)}
        self.macs = {}                           # MAC -> port
        self.delay = 0.0
        self.loss = 0.0
        self.rng = random.Random(seed)
        self.held = []                           # (due, seq, port, frame)
        self.seq = 0
        self.forwarded = 0
        self.dropped = 0

    def _send(self, port: int, frame: bytes) -> None:
        try:
            self.ports[port].send(frame)
            self.forwarded += 1
        except OSError:                          # the port is down, or its queue is full
            self.dropped += 1

    def _frame(self, src: int, frame: bytes) -> None:
        dst_mac, src_mac = frame[VNET_HDR:VNET_HDR + 6], frame[VNET_HDR + 6:VNET_HDR + 12]
        self.macs[src_mac] = src
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return
        port = self.macs.get(dst_mac)
        outs = [port] if port is not None else range(len(self.ports))
        due = time.monotonic() + self.delay if self.delay else 0.0
        for k in outs:
            if k == src:
                continue
            if due:
                self.seq += 1
                heapq.heappush(self.held, (due, self.seq, k, frame))
            else:
                self._send(k, frame)

    def _receive(self, fd: int, buf: bytearray) -> None:
        src = self.port_of[fd]
        sock = self.ports[src]
        view = memoryview(buf)
        for _ in range(256):                     # then let the other ports have a turn
            try:
                n, addr = sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:                      # the interface went down
                return
            if addr[2] != PACKET_OUTGOING:       # (our own sends show up as outgoing)
                self._frame(src, bytes(view[:n]))

    def _command(self, line: str) -> str:
        words = line.split()
        if words[:1] == ["shape"] and len(words) == 3:
            self.delay, self.loss = float(words[1]), float(words[2])
            return "ok"
        if words == ["stats"]:
            return f"stats {self.forwarded} {self.dropped}"
        return f"error: unknown command {line.strip()!r}"

    def run(self) -> None:
        poll = select.epoll()
        for s in self.ports:
            poll.register(s.fileno(), select.EPOLLIN)
        stdin = sys.stdin.fileno()
        poll.register(stdin, select.EPOLLIN)
        buf = bytearray(VNET_HDR + 65536 + 256)
        pending = b""
        print("ready", flush=True)
        while True:
            now = time.monotonic()
            while self.held and self.held[0][0] <= now:
                _, _, port, frame = heapq.heappop(self.held)
                self._send(port, frame)
            timeout = max(0.0, self.held[0][0] - now) if self.held else 1.0
            for fd, _ in poll.poll(timeout):
                if fd == stdin:
                    chunk = os.read(stdin, 4096)
                    if not chunk:
                        return
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        print(self._command(line.decode()), flush=True)
                else:
                    self._receive(fd, buf)


if __name__ == "__main__":
    Switch(sys.argv[1:]).run()
