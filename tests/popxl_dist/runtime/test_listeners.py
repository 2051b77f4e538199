"""What a single-node job exposes, for every backend and launch mode, with real launches: the
TCP listeners of every process of the job (read from /proc/net/tcp{,6}, as `ss -ltnp` does),
sampled all through the run, must all be on the loopback. This test process plays the outsider
while the job runs: it connects to every listener it finds and sends junk, and on Ray it asks
the job's GCS for the cluster's nodes without the job's token (refused) and with it (the
positive control: the probe works). The job must still end well, its output unchanged.

Not covered (documented in docs/security.md): a plain `mpiexec`/`mpirun` the user starts (MPICH's
hydra, whose control port listens on every interface), jobs across nodes."""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from procs import listening_sockets, session_pids, session_processes, wait_until
from test_instances import DP, DP_ARGS, HAVE_MPI, HAVE_RAY, ROOT, clean_env

needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray not installed")

POPXL_RUN = [sys.executable, "-m", "popxl_launch"]
CASES = {
    "local": [*POPXL_RUN, "--workers", "2", DP, *DP_ARGS, "--replicas", "2"],
    "mpi": pytest.param([*POPXL_RUN, "--backend", "mpi", "--workers", "2", DP, *DP_ARGS,
                         "--replicas", "2"], marks=needs_mpi),
    "ray": pytest.param([*POPXL_RUN, "--backend", "ray", "--workers", "2", DP, *DP_ARGS,
                         "--replicas", "2"], marks=needs_ray),
    "poprun": pytest.param([sys.executable, "-m", "popxl_launch.poprun", "--num-instances", "2",
                            "--num-replicas", "4", sys.executable, DP, *DP_ARGS],
                           marks=needs_mpi),
    "mpi-instances": pytest.param([*POPXL_RUN, "--backend", "mpi", "--instances", "2",
                                   "--replicas", "4", DP, *DP_ARGS], marks=needs_mpi),
    "ray-instances": pytest.param([*POPXL_RUN, "--backend", "ray", "--instances", "2",
                                   "--replicas", "4", DP, *DP_ARGS], marks=needs_ray),
}

# Asks a Ray GCS for its nodes with whatever token the environment gives.
GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    print("NODES", len(GcsClient(address=sys.argv[1]).get_all_node_info(timeout=20)))
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host).is_loopback


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
        return {k.decode(): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        return {}


def _junk(addr: str) -> None:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2) as s:
            s.sendall(os.urandom(512) + b"GET / HTTP/1.0\r\n\r\n")
            s.settimeout(1)
            s.recv(4096)
    except OSError:
        pass


def _gcs_probe(address: str, token) -> str:
    """NODES if the GCS answers a client holding `token` (None: no token), else REFUSED."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token is not None
               else {"RAY_AUTH_MODE": "disabled"})
    res = subprocess.run([sys.executable, "-c", GCS_PROBE, address], env=env,
                         capture_output=True, text=True, timeout=120)
    return res.stdout.strip().split()[0] if res.stdout.strip() else res.stderr[-300:]


class Watch:
    """Samples the job's listeners until it ends; probes each new one as an outsider."""

    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean_env(), cwd=ROOT,
                                     start_new_session=True)
        self.seen: dict = {}                  # address -> process name
        self.gcs: list = []                   # (address, the GCS's token)
        self.out: list = []
        reader = threading.Thread(target=lambda: self.out.extend(self.proc.communicate()))
        reader.start()
        deadline = time.monotonic() + 600
        while reader.is_alive() and time.monotonic() < deadline:
            for addr, pid in listening_sockets(session_pids(self.proc.pid)):
                if addr not in self.seen:
                    self.seen[addr] = _comm(pid)
                    if self.seen[addr] == "gcs_server":
                        self.gcs.append((addr, _environ(pid).get("RAY_AUTH_TOKEN", "")))
                    threading.Thread(target=_junk, args=(addr,), daemon=True).start()
            time.sleep(0.1)
        if reader.is_alive():
            os.killpg(self.proc.pid, 9)
        reader.join()
        self.stdout, self.stderr = self.out


@pytest.mark.parametrize("cmd", list(CASES.values()), ids=list(CASES))
def test_a_single_node_job_listens_on_the_loopback_only(cmd, request):
    name = request.node.callspec.id
    job = Watch(cmd)
    assert job.proc.returncode == 0, (job.stdout + job.stderr)[-3000:]
    assert "Accuracy on test set:" in job.stdout, job.stdout[-2000:]
    exposed = {a: n for a, n in job.seen.items() if not _loopback(a)}
    assert not exposed, f"listeners off the loopback: {exposed} (all: {job.seen})"
    if name == "local":
        assert not job.seen, job.seen            # threads: nothing listens at all
    if name.startswith(("mpi", "poprun")):
        assert not job.seen, job.seen            # gforker, MPICH on shared memory
    if name.startswith("ray"):
        assert job.gcs, job.seen
        assert len(job.gcs[0][1]) == 64, "the local Ray runs without a per-job token"
        print(f"\n{name}: listeners {sorted(job.seen.items())}")
    assert wait_until(lambda: not session_processes(job.proc.pid)), \
        session_processes(job.proc.pid)


@needs_ray
def test_the_local_ray_refuses_a_client_without_the_jobs_token():
    """The rendezvous of the Ray backends is Ray itself (actor calls carry the links' addresses
    and token): an outsider that cannot talk to the GCS cannot forge any of it."""
    script = ("import time, ray, popxl\nfrom popxl.runtime.process.ray_init import init_ray\n"
              "init_ray(1)\nprint('gcs', ray.get_runtime_context().gcs_address, flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=clean_env(), cwd=ROOT,
                            start_new_session=True)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "gcs", line
        address = line[1]
        assert _loopback(address), address
        gcs = [p for p in session_pids(proc.pid) if _comm(p) == "gcs_server"]
        token = _environ(gcs[0]).get("RAY_AUTH_TOKEN", "")
        assert len(token) == 64
        assert _gcs_probe(address, "0" * 64) == "REFUSED"          # a wrong token
        assert _gcs_probe(address, None) == "REFUSED"              # none
        assert _gcs_probe(address, token) == "NODES"               # the control: it works
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
        assert wait_until(lambda: not session_processes(proc.pid)), \
            session_processes(proc.pid)
