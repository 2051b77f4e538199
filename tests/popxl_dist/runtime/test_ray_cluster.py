"""The Ray backend on a real two-node cluster: `ray start --head` and `ray start --address=...`
as separate processes on this machine (two raylets with their own node ids, their own ports and
temp dir, so other Rays on the machine are untouched), driven through POPXL_RAY_ADDRESS and
through RAY_ADDRESS. The workers must land on both nodes, the collectives between nodes must go
through sockets (the transport's counters say so), and the results must be bitwise those of
the local backend."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from procs import run_in_session
from test_backends import (HAVE_RAY, SUITE, assert_bitwise_equal, assert_suite_ok,
                           job_processes, load_weights, local_weights, popxl_run,  # noqa: F401
                           wait_until)

pytestmark = pytest.mark.skipif(not HAVE_RAY, reason="ray not installed")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class TwoNodeCluster:
    """A head node and a worker node, 1 CPU each, every port of their own."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="pxr", dir="/tmp")    # short: socket paths
        # Token authentication off: a token file in ~/.ray (other Rays of this user) would be
        # picked up by one node and not the other.
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp, "RAY_AUTH_MODE": "disabled"}
        self.env.pop("RAY_ADDRESS", None)
        self.sessions: list = []
        from ray.util import get_node_ip_address

        self.ip = get_node_ip_address()
        self.port = _free_ports(1)[0]
        self.address = f"{self.ip}:{self.port}"

    def _start(self, *args: str) -> None:
        p = _free_ports(6)
        cmd = [RAY, "start", *args, "--num-cpus", "1", "--disable-usage-stats",
               "--dashboard-agent-listen-port", str(p[0]), "--dashboard-agent-grpc-port",
               str(p[1]), "--runtime-env-agent-port", str(p[2]), "--metrics-export-port",
               str(p[3]), "--node-manager-port", str(p[4]), "--object-manager-port", str(p[5])]
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.sessions.append(proc.pid)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-3000:]

    def __enter__(self) -> "TwoNodeCluster":
        try:
            self._start("--head", "--port", str(self.port), "--include-dashboard", "false",
                        "--temp-dir", os.path.join(self.tmp, "ray"))
            self._start("--address", self.address)
        except BaseException:
            self.__exit__()
            raise
        return self

    def processes(self) -> list:
        return [line for sid in self.sessions for line in job_processes(sid)]

    def __exit__(self, *exc) -> None:
        """Stop both nodes: every process of the two `ray start` sessions (never `ray stop`,
        which would stop every Ray of this user on the machine)."""
        for line in self.processes():
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except OSError:
                pass
        wait_until(lambda: not self.processes(), timeout=20)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _run(cluster: TwoNodeCluster, variable: str, tmp_path, *args: str):
    stats = tmp_path / f"stats-{variable}.json"
    res = popxl_run("ray", 3, SUITE, "--transport-stats", str(stats), *args,
                    env={variable: cluster.address, "RAY_TMPDIR": cluster.tmp,
                         "RAY_AUTH_MODE": "disabled"})
    assert_suite_ok(res)
    with open(stats) as f:
        return res, json.load(f)


def test_two_node_cluster_spreads_workers_and_carries_collectives_over_sockets(
        tmp_path, local_weights):  # noqa: F811
    with TwoNodeCluster() as cluster:
        path = tmp_path / "cluster.npz"
        res, stats = _run(cluster, "POPXL_RAY_ADDRESS", tmp_path, "--dp-weights", str(path))
        assert_bitwise_equal(load_weights(path), local_weights)
        nodes = [s["node"] for s in stats]
        assert len(set(nodes)) == 2, stats                 # workers on both nodes
        for s in stats:
            for peer, kind in s["links"].items():
                across = nodes[int(peer)] != s["node"]
                assert kind == ("socket" if across else "shm"), stats
        sent = {k: sum(s["data_bytes_sent"][k] for s in stats) for k in ("shm", "socket")}
        assert sent["socket"] > 0, stats                   # the collectives crossed nodes
        assert sent["shm"] > 0, stats                      # and used shared memory within one

        # Ray instances across the two nodes: their links (and the launcher's) are sockets,
        # proven with the job's token, listening on the nodes' address during set-up only
        dp = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(__file__))))), "examples", "mnist_popdist.py")
        env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
        env.update({"POPXL_RAY_ADDRESS": cluster.address, "RAY_TMPDIR": cluster.tmp,
                    "RAY_AUTH_MODE": "disabled"})
        inst = run_in_session([sys.executable, "-m", "popxl_launch", "--backend", "ray",
                               "--instances", "2", "--replicas", "4", dp, "--limit", "2",
                               "--test-batches", "1"], env, os.path.dirname(dp), 300)
        assert inst.returncode == 0, (inst.stdout + inst.stderr)[-3000:]
        assert "[instance 0] Accuracy on test set:" in inst.stdout, inst.stdout[-2000:]

        # Ray's own variable works too, and the job left nothing on the cluster's nodes
        res, stats = _run(cluster, "RAY_ADDRESS", tmp_path, "--no-cases")
        assert len({s["node"] for s in stats}) == 2, stats
        assert wait_until(lambda: not job_processes(res.sid)), job_processes(res.sid)
        actors = [line for line in cluster.processes() if "_ActorWorker" in line]
        assert wait_until(lambda: not [line for line in cluster.processes()
                                       if "_ActorWorker" in line]), actors
    assert not cluster.processes()
