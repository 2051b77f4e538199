"""A hostile process on the same machine, for the tests: `python outsider.py MODE ARGS...`.

It prints `ready` once it is in place, then one JSON line saying what it got.

  wrong-token HOST PORT JOB SRC DST   a well-formed hello proven with another token
  spoof HOST PORT SRC DST             a hello claiming to be member SRC, with a made-up proof
  slowloris HOST PORT N               N connections that send 4 bytes of a hello and stall
  junk HOST PORT                      random bytes (any protocol's listener)
  impostor                            listens; answers a member's hello with a made-up proof

Modes that connect report `{"received": bytes the listener sent, "closed": whether it closed the
connection}` (`closed` after up to 30 s; a job's listener closes a connection that failed its
check at once, and a stalled one when its set-up ends).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

MAGIC = b"PXLMESH1"
HELLO = struct.Struct("<8sII16s32s")


def _watch(socks, wait: float = 30.0) -> dict:
    """Read from `socks` until each is closed (or `wait` seconds pass)."""
    received, open_ = 0, list(socks)
    deadline = time.monotonic() + wait
    for s in open_:
        s.settimeout(0.2)
    while open_ and time.monotonic() < deadline:
        for s in list(open_):
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                open_.remove(s)
            received += len(chunk)
    return {"received": received, "closed": not open_}


def _connect(host: str, port: int) -> socket.socket:
    return socket.create_connection((host, port), timeout=10)


def main(argv) -> int:
    mode = argv[0]
    if mode == "impostor":
        with socket.create_server(("127.0.0.1", 0)) as lst:
            print(f"ready {lst.getsockname()[1]}", flush=True)
            lst.settimeout(60)
            conn, _ = lst.accept()
            conn.settimeout(10)
            got = b""
            while len(got) < HELLO.size:
                chunk = conn.recv(HELLO.size - len(got))
                if not chunk:
                    break
                got += chunk
            conn.sendall(os.urandom(32))           # cannot prove a token it does not know
            res = _watch([conn])
            res["hello_bytes"] = len(got)
            print(json.dumps(res), flush=True)
        return 0
    host, port = argv[1], int(argv[2])
    if mode == "slowloris":
        socks = []
        for _ in range(int(argv[3])):
            try:
                s = socket.create_connection((host, port), timeout=2)
                s.sendall(MAGIC[:4])
                socks.append(s)
            except OSError:
                pass                    # the listener's backlog is full: enough stalling

        print("ready", flush=True)
        print(json.dumps(_watch(socks, wait=60)), flush=True)
        return 0
    s = _connect(host, port)
    if mode == "wrong-token":
        job, src, dst = argv[3], int(argv[4]), int(argv[5])
        nonce = os.urandom(16)
        msg = b"\0".join([b"connect", job.encode(), struct.pack("<II", src, dst), nonce])
        mac = hmac.new(os.urandom(32), msg, hashlib.sha256).digest()
        s.sendall(HELLO.pack(MAGIC, src, dst, nonce, mac))
    elif mode == "spoof":
        s.sendall(HELLO.pack(MAGIC, int(argv[3]), int(argv[4]), os.urandom(16), os.urandom(32)))
    elif mode == "junk":
        try:
            s.sendall(os.urandom(4096))
        except OSError:
            pass
    print("ready", flush=True)
    print(json.dumps(_watch([s])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
