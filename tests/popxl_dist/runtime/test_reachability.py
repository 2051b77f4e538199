"""The pieces that tell a host that stopped answering, without simulated hosts: the kernel's
keepalive settings on the job's sockets, a socket's state read without reading it, the error
that names a host and the workers on it, the MPI heartbeats between real ranks (one stops
itself and is reported silent; the last messages leave nothing unread), and the timeout
setting. (Hosts really cut off: tests/popxl_dist/runtime/test_hosts_*.py.)"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from popxl.errors import HostUnreachable, WorkerDied
from popxl.runtime.transport.endpoint import Endpoint
from popxl.runtime.env import peer_timeout
from popxl.runtime.transport.links import Link
from popxl.runtime.transport.pipes import SocketPipe
from popxl.runtime.transport.reachability import host_unreachable, keep_alive, socket_error
from test_backends import HAVE_MPI


def _tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as lst:
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    return a, b


def test_keepalive_makes_the_kernel_give_up_on_a_silent_peer_after_the_timeout():
    a, b = _tcp_pair()
    with a, b:
        keep_alive(a, 4.5)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
        assert a.getsockopt(socket.IPPROTO_TCP, 18) == 4500        # TCP_USER_TIMEOUT, ms


def test_a_sockets_state_is_read_without_reading_it():
    a, b = _tcp_pair()
    with a:
        b.sendall(b"data")
        assert socket_error(a) is None                  # open (its data left unread)
        b.close()
        assert socket_error(a) == 0                     # ended by the peer: not a cut
        assert a.recv(10) == b"data"


def test_a_link_that_timed_out_names_the_host_and_every_worker_on_it():
    a, b = _tcp_pair()
    pipe = SocketPipe(a, peer_timeout=3)
    b.close()
    pipe._died(OSError(errno.ETIMEDOUT, "Connection timed out"))
    assert pipe.dead and pipe.unreachable
    ep = Endpoint(0, 5.0)
    ep.what = "Ray actor"
    ep.add_link(Link(2, pipe, pipe, lambda kind, n: bytearray(n)))
    ep.procs = {0: ("h1", 10), 1: ("h2", 11), 2: ("h3", 12), 3: ("h3", 13)}
    ep.addresses = {2: "10.0.0.3", 3: "10.0.0.3"}
    err = ep.died([2], "while worker 0 waited")
    assert isinstance(err, HostUnreachable) and isinstance(err, WorkerDied)
    assert str(err).startswith("host h3 (10.0.0.3) is unreachable: nothing came from it for ")
    assert "worker 2 (Ray actor, pid 12 on h3), worker 3 (Ray actor, pid 13 on h3) on it " \
           "are lost while worker 0 waited" in str(err)
    assert (err.workers, err.hosts, err.host) == ([2, 3], ["h3"], "h3")
    pipe.close()


def test_the_heartbeats_wording_says_a_stopped_process_looks_the_same():
    err = host_unreachable({"h2": ""}, {1: ("h2", "MPI rank 1, pid 7")}, 10, heartbeats=True)
    assert str(err) == ("host h2 is unreachable: no heartbeat came from it for 10 s "
                        "(POPXL_PEER_TIMEOUT; or its processes are stopped); worker 1 (MPI "
                        "rank 1, pid 7) on it is lost")


@pytest.mark.parametrize("value, ok", [("", 10.0), ("2.5", 2.5), ("0", None), ("x", None),
                                       ("inf", None)])
def test_peer_timeout_setting(monkeypatch, value, ok):
    monkeypatch.setenv("POPXL_PEER_TIMEOUT", value)
    if ok is None:
        with pytest.raises(ValueError, match="POPXL_PEER_TIMEOUT"):
            peer_timeout()
    else:
        assert peer_timeout() == ok


HEARTBEATS = r"""
import os, signal, sys, time
from mpi4py import MPI
from popxl.runtime.transport.mpi_heartbeat import MPIHeartbeat
world = MPI.COMM_WORLD
rank = world.Get_rank()
pids = world.allgather(os.getpid())
beat = MPIHeartbeat(world.Dup(), timeout=1.0, period=0.1)
world.Barrier()
if rank == 0:
    time.sleep(0.5)
    assert beat.silent([1]) == [], "a live peer is silent"
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    while not beat.silent([1]):
        assert time.monotonic() - t0 < 30, "a stopped peer never went silent"
        time.sleep(0.05)
    print(f"silent after {time.monotonic() - t0:.1f} s", flush=True)
    os.kill(pids[1], signal.SIGCONT)
    world.send("done", dest=1)
else:
    req = world.irecv(source=0)           # beating meanwhile (stopped for a while)
    while not req.Test():
        time.sleep(0.01)
print(f"rank {rank} closed cleanly: {beat.close(patience=20)}", flush=True)
"""


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
def test_mpi_heartbeats_name_a_silent_rank_and_end_without_leftovers():
    gforker = os.path.join(os.path.dirname(sys.executable), "mpiexec.gforker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    res = subprocess.run([gforker, "-n", "2", sys.executable, "-c", HEARTBEATS], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "silent after" in res.stdout
    assert "rank 0 closed cleanly: True" in res.stdout
    assert "rank 1 closed cleanly: True" in res.stdout
    assert "WARN" not in res.stdout + res.stderr
