"""Building a job's links (`mesh.py`) with members as threads of this process, and outsiders as
real processes on the loopback (`outsider.py`): a connection that does not prove the job's token
(wrong token, a spoofed member index, junk) is closed without being sent a byte; stalled
connections (slow-loris) do not hold up the set-up; a listener that cannot prove the token is
refused before anything is sent to it; shared-memory rings are private files, gone once mapped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest
from popxl.engine.comm import Communicator, Layout
from popxl.runtime.transport import mesh as mesh_mod
from popxl.runtime.transport.endpoint import Endpoint, EndpointTransport
from popxl.runtime.transport.mesh import HELLO, MeshMember, listen_address, new_token
from popxl.runtime.transport.pipes import (SHM_DIR, ShmRing, shm_supported, unlink_segments)

HERE = os.path.dirname(os.path.abspath(__file__))
OUTSIDER = os.path.join(HERE, "outsider.py")
needs_shm = pytest.mark.skipif(not shm_supported(), reason="no shared-memory rings here")


@pytest.fixture
def job():
    name = f"popxl-test-mesh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    unlink_segments(name)


def _threads(fns, timeout: float = 120.0):
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a member hung"
    return out


def members(job: str, size: int, kind: str, token: bytes = b""):
    token = token or new_token()
    shm = kind == "shm"
    eps = [Endpoint(i, 30.0) for i in range(size)]
    return [MeshMember(ep, job, token, size, "node-a", "127.0.0.1", shm,
                       listen_address(False, shm, "127.0.0.1")) for ep in eps]


def build(ms, before_connect=None):
    """hello / connect / attach for every member (attach in threads), like a coordinator."""
    table = [m.hello() for m in ms]
    if before_connect is not None:
        before_connect(table)
    for m in ms:
        m.connect(table)
    errors = [e for e in _threads([m.attach for m in ms]) if e is not None]
    assert not errors, errors
    for m in ms:
        m.finish()
    return table


def all_reduce_works(ms) -> None:
    """A 4-replica all-reduce over the members' links gives NumPy's sum bitwise."""
    W = len(ms)
    layout = Layout(2 * W, W)
    values = [np.random.default_rng(r).normal(size=1000).astype(np.float32) for r in range(2 * W)]

    def worker(w):
        tr = EndpointTransport(ms[w].ep, lambda run_id, waiting: False)
        tr.start_run(1)
        comm = Communicator(layout, w, tr)
        comm.tag += 1
        return comm.all_reduce([values[r].copy() for r in layout.replicas_of(w)], "add", 1,
                               2 * W)

    single = Communicator(Layout(2 * W, 1), 0).all_reduce([v.copy() for v in values], "add", 1,
                                                         2 * W)[0]
    for res in _threads([lambda w=w: worker(w) for w in range(W)]):
        assert not isinstance(res, BaseException), res
        for out in res:
            assert out.tobytes() == single.tobytes()
    for m in ms:
        m.ep.close()


class Outsider:
    """An `outsider.py` process: started, then waited for `ready`."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, OUTSIDER, *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self.proc.stdout.readline().split()
        assert self.ready and self.ready[0] == "ready", self.proc.stderr.read()

    def result(self) -> dict:
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", [pytest.param("shm", marks=needs_shm), "socket"])
def test_members_build_links_and_listen_only_where_needed(job, kind):
    ms = members(job, 3, kind)
    table = build(ms)
    if kind == "shm":
        assert all(t["port"] == 0 for t in table)             # one node: no listener at all
        assert not [f for f in os.listdir(SHM_DIR) if f.startswith(job)]   # names removed
    else:
        assert all(t["ip"] == "127.0.0.1" for t in table)     # one node: loopback only
    all_reduce_works(ms)
    assert listen_address(True, True, "10.1.2.3") == "10.1.2.3"   # only a job across nodes


@pytest.mark.parametrize("mode", ["wrong-token", "spoof", "junk"])
def test_a_connection_that_does_not_prove_the_token_is_closed_unanswered(job, mode):
    ms = members(job, 3, "socket")
    outsiders = []

    def attack(table):
        # Before the real members connect: the outsider is first in line at member 0.
        port = table[0]["port"]
        args = {"wrong-token": [job, 2, 0], "spoof": [2, 0], "junk": []}[mode]
        outsiders.append(Outsider(mode, "127.0.0.1", port, *args))

    build(ms, attack)
    res = outsiders[0].result()
    assert res == {"received": 0, "closed": True}, res     # not one byte, connection closed
    all_reduce_works(ms)                                  # and the real member 2 got in


def test_stalled_connections_do_not_hold_up_the_setup(job, monkeypatch):
    # A stalled connection is dropped at its own deadline (made very long here): if set-up
    # waited for it, attach would fail at its own timeout instead of completing.
    monkeypatch.setattr(mesh_mod, "HANDSHAKE_TIMEOUT", 600.0)
    ms = members(job, 3, "socket")
    outsiders = []

    def attack(table):
        outsiders.append(Outsider("slowloris", "127.0.0.1", table[0]["port"],
                                  mesh_mod.MAX_PENDING + 8))
        outsiders.append(Outsider("slowloris", "127.0.0.1", table[1]["port"], 3))

    build(ms, attack)
    for o in outsiders:
        assert o.result() == {"received": 0, "closed": True}
    all_reduce_works(ms)


def test_a_listener_that_cannot_prove_the_token_is_refused(job):
    impostor = Outsider("impostor")
    ms = members(job, 2, "socket")
    table = [m.hello() for m in ms]
    table[0] = dict(table[0], port=int(impostor.ready[1]))   # a forged address for member 0
    ms[1].connect(table)
    with pytest.raises(ConnectionError, match="did not prove the job's token"):
        ms[1].attach(timeout=30)
    ms[1].abandon()
    ms[0].abandon()
    res = impostor.result()
    # It saw member 1's hello (a nonce and an HMAC: not the token) and nothing after it.
    assert res["hello_bytes"] == HELLO.size and res["received"] == 0, res


@needs_shm
def test_rings_are_private_files_and_refused_otherwise(job):
    ring = ShmRing(f"{job}-0-1", 1 << 12, create=True)
    path = os.path.join(SHM_DIR, f"{job}-0-1")
    assert os.stat(path).st_mode & 0o777 == 0o600
    if os.geteuid() == 0:
        # Another account cannot open it: the test runs as root, so the outsider is a child
        # process that drops to nobody (it cannot exec this venv's Python under /root).
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.open(path, os.O_RDWR)
            except PermissionError:
                code = 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
    os.chmod(path, 0o644)                                 # not private any more: refused
    with pytest.raises(PermissionError, match="not a private segment"):
        ShmRing(f"{job}-0-1", 1 << 12, create=False)
    ring.unlink()
    ring.close()
