"""Instance output: every line an instance writes gets the launcher's prefix (poprun's
`[1,N]<stdout>: `, popxl-run's `[instance N] `), so interleaved output stays readable."""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional, Tuple

__all__ = ["POPRUN_PREFIX", "POPXL_RUN_PREFIX", "LinePrefixer", "pump", "write_all"]

# Graphcore's poprun tags each line like Open MPI's `--tag-output`: `[<job>,<rank>]<stream>:`.
POPRUN_PREFIX = "[1,{i}]<{stream}>: "
POPXL_RUN_PREFIX = "[instance {i}] "


class LinePrefixer:
    """Turns a byte stream into whole lines, each with `prefix` in front (a partial last line is
    held until its newline or `flush`)."""

    def __init__(self, prefix: str):
        self.prefix = prefix.encode()
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        head, sep, self._partial = (self._partial + data).rpartition(b"\n")
        if not sep:
            return b""
        return b"".join(self.prefix + line + b"\n" for line in head.split(b"\n"))

    def flush(self) -> bytes:
        rest, self._partial = self._partial, b""
        return self.prefix + rest + b"\n" if rest else b""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return                   # the reader went away: nothing useful to do
        view = view[n:]


def pump(src_fd: int, write: Callable[[bytes], None], prefix: Optional[str],
         keep: bool = True) -> threading.Thread:
    """A daemon thread copying `src_fd` to `write` until EOF, prefixing lines when `prefix` is
    given and discarding everything when `keep` is False; closes `src_fd` at the end."""

    def run() -> None:
        pre = LinePrefixer(prefix) if prefix is not None else None
        try:
            while True:
                try:
                    chunk = os.read(src_fd, 65536)
                except InterruptedError:
                    continue
                if not chunk:
                    break
                if keep:
                    write(pre.feed(chunk) if pre else chunk)
            if keep and pre:
                write(pre.flush())
        finally:
            os.close(src_fd)

    t = threading.Thread(target=run, name="popxl-output", daemon=True)
    t.start()
    return t


def host_fds(env: dict) -> Optional[Tuple[int, int]]:
    """The launcher's stdout/stderr descriptors (`POPXL_HOST_STDIO`), when this process runs on
    the launcher's host (descriptors do not cross hosts)."""
    import socket

    fds = env.get("POPXL_HOST_STDIO", "")
    if not fds or env.get("POPXL_LAUNCH_HOST", "") != socket.gethostname():
        return None
    out, err = (int(x) for x in fds.split(","))
    return out, err
