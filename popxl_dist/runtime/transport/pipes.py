"""Non-blocking byte pipes between two processes: a ring in shared memory (same node) and a TCP
socket (any two nodes). Both offer `write(view) -> bytes taken` and `readinto(view) -> bytes
read`, never block, and report a dead peer, so one message layer (`links.py`) runs on either.

The shared-memory ring is single-producer single-consumer: the writer owns `head`, the reader
owns `tail` (byte counts since creation, in separate cache lines), and each publishes its
counter only after copying the bytes. That ordering is enough on x86-64 (stores are seen in
order, loads are not reordered with loads); `shm_supported()` says no elsewhere, and the Ray
backend then uses sockets between processes of one node too.
"""
from __future__ import annotations

import errno
import glob
import mmap
import os
import platform
import socket
from typing import Optional

import numpy as np

from ..env import peer_timeout as env_peer_timeout
from .reachability import is_unreachable, keep_alive, socket_error

__all__ = ["ShmRing", "SocketPipe", "shm_supported", "unlink_segments", "SHM_DIR"]

SHM_DIR = "/dev/shm"
_HEAD, _TAIL, _DATA = 0, 64, 128          # byte offsets of the counters and the ring


def shm_supported() -> bool:
    """Whether processes of one node can talk through shared-memory rings here (Linux tmpfs
    shared memory and x86-64 store ordering)."""
    return (platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(SHM_DIR)
            and os.access(SHM_DIR, os.W_OK))


def unlink_segments(prefix: str) -> int:
    """Remove every shared-memory segment whose name starts with `prefix`; their number."""
    n = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "*")):
        try:
            os.unlink(path)
            n += 1
        except FileNotFoundError:
            pass
    return n


def _check_private(fd: int, path: str, size: int) -> None:
    """Refuse a segment that is not this user's own private file of the expected size (the
    creator makes it `O_EXCL`, mode 0600)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != size:
        raise PermissionError(f"shared-memory segment {path} is not a private segment of this "
                              f"user (owner {st.st_uid}, mode {oct(st.st_mode & 0o777)}, "
                              f"{st.st_size} bytes)")


class ShmRing:
    """One direction of a same-node link: a byte ring of `capacity` (a power of two) bytes in
    the shared-memory segment `name`. The writer creates it, the reader attaches; either may
    `unlink()` the name once both have it mapped (the mapping outlives the name)."""

    kind = "shm"

    def __init__(self, name: str, capacity: int, create: bool):
        if capacity & (capacity - 1):
            raise ValueError(f"ShmRing capacity must be a power of two, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._mask = capacity - 1
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, _DATA + capacity)
            else:
                _check_private(fd, path, _DATA + capacity)
            # Populate the pages now: first-touch faults on tmpfs cost ~10 us per page.
            self._mm = mmap.mmap(fd, _DATA + capacity,
                                 flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        self._head = np.frombuffer(self._mm, np.uint64, 1, _HEAD)
        self._tail = np.frombuffer(self._mm, np.uint64, 1, _TAIL)
        self._data = memoryview(self._mm)[_DATA:]
        self.dead = False                    # rings cannot tell; liveness is checked by pid
        self.unreachable = False             # (one host: never)

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass

    def write(self, src: memoryview) -> int:
        """Copy as much of `src` as fits; the number of bytes taken."""
        head = int(self._head[0])
        n = min(len(src), self.capacity - (head - int(self._tail[0])))
        if n <= 0:
            return 0
        pos = head & self._mask
        first = min(n, self.capacity - pos)
        self._data[pos:pos + first] = src[:first]
        if n > first:
            self._data[:n - first] = src[first:n]
        self._head[0] = head + n             # publish after the bytes
        return n

    def readinto(self, dst: memoryview) -> int:
        """Copy up to len(dst) available bytes into `dst`; the number copied."""
        tail = int(self._tail[0])
        n = min(len(dst), int(self._head[0]) - tail)
        if n <= 0:
            return 0
        pos = tail & self._mask
        first = min(n, self.capacity - pos)
        dst[:first] = self._data[pos:pos + first]
        if n > first:
            dst[first:n] = self._data[:n - first]
        self._tail[0] = tail + n             # release the space after copying out
        return n

    def readable(self) -> bool:
        return int(self._head[0]) != int(self._tail[0])

    def probe(self) -> bool:
        return self.dead

    def close(self) -> None:
        if self._mm is None:
            return
        self._head = self._tail = None
        self._data.release()
        self._data = None
        try:
            self._mm.close()
        except BufferError:                  # a view is still alive somewhere: leave it to GC
            pass
        self._mm = None


class SocketPipe:
    """Both directions of a link over a connected stream socket (made non-blocking). A TCP
    connection is kept alive by the kernel (`reachability.keep_alive`): once its peer has
    answered nothing for `peer_timeout` seconds it fails, and `unreachable` says so."""

    kind = "socket"

    def __init__(self, sock: socket.socket, peer_timeout: Optional[float] = None):
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock, peer_timeout if peer_timeout is not None else env_peer_timeout())
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:
                pass
        self.sock: Optional[socket.socket] = sock
        self.dead = False
        self.error: Optional[int] = None     # the errno that ended the connection, if any

    @property
    def unreachable(self) -> bool:
        """Whether the connection ended because its peer's host stopped answering."""
        return is_unreachable(self.error)

    def write(self, src: memoryview) -> int:
        if self.dead:
            return 0
        try:
            return self.sock.send(src)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self._died(e)
            return 0

    def readinto(self, dst: memoryview) -> int:
        if self.dead:
            return 0
        try:
            n = self.sock.recv_into(dst)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self._died(e)
            return 0
        if n == 0 and len(dst):
            self._died(None)                 # orderly EOF: the peer closed or exited
        return n

    def readable(self) -> bool:
        return True                          # recv_into tells (cheaply) when it is not

    def probe(self) -> bool:
        """Whether the connection has ended, read from the socket's state without reading
        data (safe beside the thread that uses the pipe)."""
        sock = self.sock
        if self.dead or sock is None:
            return True
        err = socket_error(sock)
        if err is None:
            return False
        if self.error is None and err:
            self.error = err
        return True

    def _died(self, err: Optional[OSError]) -> None:
        if err is not None and err.errno not in (errno.ECONNRESET, errno.EPIPE,
                                                 errno.ECONNABORTED, errno.ENOTCONN,
                                                 errno.EBADF) and not is_unreachable(err.errno):
            raise err
        if err is not None and self.error is None:
            self.error = err.errno
        self.dead = True

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        self.dead = True
