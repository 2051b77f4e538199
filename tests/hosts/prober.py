"""The outsider of the tests across simulated hosts: `python prober.py`, run on a host that is
not in the job. It reads `HOST:PORT` lines on stdin and answers each with one JSON line: what
that listener sent back to three connections, each closed by the listener or by this prober
after a second:

  junk         random bytes, then an HTTP request line;
  forged       a well-formed hello of the job's links (`popxl.runtime.transport.mesh`: magic, member
               indices, nonce) with a made-up proof;
  wrong_token  the same hello proven with a token of the prober's own for a guessed job name.

`{"address": ..., "junk": {"received": bytes, "first": hex of the first 512}, ...}`, or
`"error"` when the connection failed (a listener already gone).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import threading

MAGIC = b"PXLMESH1"
HELLO = struct.Struct("<8sII16s32s")


def _hello(proof_token: bytes = b"") -> bytes:
    nonce = os.urandom(16)
    if not proof_token:
        return HELLO.pack(MAGIC, 1, 0, nonce, os.urandom(32))
    msg = b"\0".join([b"connect", b"popxl-ray-1-guess", struct.pack("<II", 1, 0), nonce])
    return HELLO.pack(MAGIC, 1, 0, nonce, hmac.new(proof_token, msg, hashlib.sha256).digest())


def _send(address: str, payload: bytes) -> dict:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2) as s:
            try:
                s.sendall(payload)
            except OSError:
                pass
            got = b""
            s.settimeout(1.0)
            try:
                while len(got) < 1 << 16:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            except OSError:
                pass
        return {"received": len(got), "first": got[:512].hex()}
    except OSError as e:
        return {"error": str(e)}


def probe(address: str) -> dict:
    payloads = {"junk": os.urandom(512) + b"GET / HTTP/1.0\r\n\r\n", "forged": _hello(),
                "wrong_token": _hello(os.urandom(32))}
    out: dict = {"address": address}
    threads = [threading.Thread(target=lambda k=k, p=p: out.__setitem__(k, _send(address, p)))
               for k, p in payloads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def main() -> int:
    print("ready", flush=True)
    for line in sys.stdin:
        address = line.strip()
        if address:
            print(json.dumps(probe(address)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
