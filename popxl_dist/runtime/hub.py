"""The launcher's hub for instances that are not MPI ranks (`popxl-run --backend ray
--instances N`): a small TCP server in the launcher that

* introduces the instances to each other (each registers the address it listens on; once all
  have, every one gets the full list and they connect directly: `instance_socket.py`),
* relays failure notices (an instance failed, or the launcher saw one die) to every instance,
* carries the instances' output to the launcher.

Messages are JSON objects, one per line. Instance -> hub: `register` (index, host, port),
`failed` (origin, message), `bye`, `output` (index, stream, data). Hub -> instance: `peers`
(list of [host, port]), `failed` (origin, message).
"""
from __future__ import annotations

import json
import socket
import threading
from typing import Callable, Dict, List, Optional, Tuple

__all__ = ["InstanceHub", "send_message", "LineReader"]


def send_message(sock: socket.socket, msg: dict, lock: Optional[threading.Lock] = None) -> None:
    data = (json.dumps(msg) + "\n").encode()
    if lock is None:
        sock.sendall(data)
        return
    with lock:
        sock.sendall(data)


class LineReader:
    """Splits bytes received from a socket into JSON messages."""

    def __init__(self):
        self._buf = b""

    def feed(self, data: bytes) -> List[dict]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


class InstanceHub:
    """The hub of one launch of `num_instances` instances (see module doc).

    Args:
        num_instances: instances that will register.
        on_output: called as `on_output(index, stream, text)` for each output chunk.
        host: the address to listen on (reachable by the instances).
    """

    def __init__(self, num_instances: int, on_output: Callable[[int, str, str], None],
                 host: str = "127.0.0.1"):
        self.num_instances = num_instances
        self.on_output = on_output
        self._server = socket.create_server((host, 0))
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        self._controls: Dict[int, Tuple[socket.socket, threading.Lock]] = {}
        self._registered: Dict[int, List[Tuple[int, str, int]]] = {}   # generation -> entries
        self._generation: Dict[int, int] = {}                          # instance -> count
        self._conns: List[socket.socket] = []
        self.failures: List[Tuple[int, str]] = []
        self._closed = False
        threading.Thread(target=self._accept, name="popxl-hub", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = LineReader()
        wlock = threading.Lock()
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                for msg in reader.feed(data):
                    self._handle(conn, wlock, msg)
        except (OSError, ValueError):
            return

    def _handle(self, conn: socket.socket, wlock: threading.Lock, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == "output":
            self.on_output(int(msg["index"]), msg["stream"], msg["data"])
        elif kind == "register":
            self._register(conn, wlock, int(msg["index"]), msg["host"], int(msg["port"]))
        elif kind == "failed":
            self.broadcast_failure(int(msg["origin"]), str(msg["message"]))

    def _register(self, conn, wlock, index: int, host: str, port: int) -> None:
        with self._lock:
            self._controls[index] = (conn, wlock)
            gen = self._generation.get(index, 0)
            self._generation[index] = gen + 1
            entries = self._registered.setdefault(gen, [])
            entries.append((index, host, port))
            if len(entries) < self.num_instances:
                return
            peers = [[h, p] for _, h, p in sorted(entries)]
            targets = [self._controls[i] for i, _, _ in entries]
        for sock, lock in targets:
            try:
                send_message(sock, {"kind": "peers", "peers": peers}, lock)
            except OSError:
                pass

    def broadcast_failure(self, origin: int, message: str) -> None:
        """Tell every instance (but `origin`) that instance `origin` failed; the first notice
        about each origin only."""
        with self._lock:
            if any(o == origin for o, _ in self.failures):
                return
            self.failures.append((origin, message))
            targets = [(i, c) for i, c in self._controls.items() if i != origin]
        for _, (sock, lock) in targets:
            try:
                send_message(sock, {"kind": "failed", "origin": origin, "message": message},
                             lock)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
