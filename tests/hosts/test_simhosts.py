"""The simulated hosts themselves: own names, addresses, /dev/shm, /tmp and boot id; names that
resolve; the ssh stand-in (login environment, no descendant of the caller, hung up on when the
caller goes while the host is on the network); the switch's delay (measured: round trips take
at least twice the one-way delay) and loss; a cut link; and a teardown that leaves no
namespace, link, process or file."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest

from hostjobs import require_hosts
from simhosts import SimHosts

require_hosts()

ECHO = r"""
import socket, sys
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((sys.argv[1], 7000))
print("ready", flush=True)
while True:
    data, peer = udp.recvfrom(2048)
    if data == b"stop":
        break
    udp.sendto(data, peer)
"""

PING = r"""
import json, socket, sys, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.settimeout(float(sys.argv[3]))
rtts, lost = [], 0
for i in range(int(sys.argv[2])):
    t0 = time.monotonic()
    udp.sendto(str(i).encode(), (sys.argv[1], 7000))
    try:
        while udp.recv(2048) != str(i).encode():
            pass
        rtts.append(time.monotonic() - t0)
    except socket.timeout:
        lost += 1
print(json.dumps({"rtts": rtts, "lost": lost}))
"""


def _ping(src, dst, n: int, timeout: float = 1.0) -> dict:
    import json

    res = src.run([sys.executable, "-c", PING, dst.address, str(n), str(timeout)], timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _names(sim: SimHosts) -> tuple:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ([n for n in netns.split() if n.startswith(sim.prefix)],
            [line for line in links.splitlines() if sim.prefix in line])


def test_hosts_are_separate_machines_on_a_shaped_network(tmp_path):
    sim = SimHosts(3, str(tmp_path))
    with sim:
        h1, h2, h3 = sim.hosts
        assert len({h.address for h in sim}) == 3
        assert _names(sim)[0] and _names(sim)[1]
        probe = ("import socket, os; print(socket.gethostname(), socket.gethostbyname('h2'), "
                 "socket.gethostbyname('h3'), open('/proc/sys/kernel/random/boot_id').read()"
                 ".strip(), sorted(os.listdir('/dev/shm')))")
        seen = [h.run([sys.executable, "-c", probe]).stdout.split(maxsplit=3) for h in sim]
        assert [s[0] for s in seen] == ["h1", "h2", "h3"]
        assert all(s[1:3] == [h2.address, h3.address] for s in seen)       # names resolve
        assert len({s[3].split()[0] for s in seen}) == 3                    # own boot ids
        # its own /dev/shm and /tmp: a file made on h1 is on neither h2 nor this machine
        h1.run(["sh", "-c", "echo x > /dev/shm/pxsim-probe; echo x > /tmp/pxsim-probe"])
        assert h1.run(["ls", "/dev/shm/pxsim-probe", "/tmp/pxsim-probe"]).returncode == 0
        assert h2.run(["ls", "/dev/shm/pxsim-probe"]).returncode != 0
        assert h2.run(["ls", "/tmp/pxsim-probe"]).returncode != 0
        assert not os.path.exists("/dev/shm/pxsim-probe")
        # the shared folder is the same on every host
        h2.run(["sh", "-c", f"echo shared > {sim.shared}/f"])
        assert h3.run(["cat", f"{sim.shared}/f"]).stdout == "shared\n"

        echoes = [h.popen([sys.executable, "-c", ECHO, h.address], stdout=subprocess.PIPE,
                          text=True) for h in (h2, h3)]
        assert [e.stdout.readline().strip() for e in echoes] == ["ready", "ready"]
        base = _ping(h1, h2, 20)
        assert base["lost"] == 0

        delay = 0.02
        sim.shape(delay=delay)
        shaped = _ping(h1, h2, 10)
        assert shaped["lost"] == 0
        # one way 20 ms on each crossing: a round trip takes at least 40 ms
        assert min(shaped["rtts"]) >= 2 * delay, shaped
        print(f"\nround trip h1-h2: {statistics.median(base['rtts']) * 1e3:.2f} ms; with "
              f"{delay * 1e3:g} ms delay: {statistics.median(shaped['rtts']) * 1e3:.1f} ms")

        sim.shape(loss=0.5)
        before = sim.stats()["dropped"]
        lossy = _ping(h1, h2, 30, timeout=0.05)
        assert lossy["lost"] > 0 and sim.stats()["dropped"] > before
        sim.shape()

        h2.cut()
        assert _ping(h1, h2, 3, timeout=0.1)["lost"] == 3            # nothing gets through
        assert _ping(h1, h3, 3)["lost"] == 0                         # the others still talk
        h2.restore()
        assert _ping(h1, h2, 3)["lost"] == 0

        # ssh: a login environment, the remote command no descendant of the ssh process
        res = subprocess.run([sim.ssh, "-x", "h3", "hostname; echo ${PXSIM_MARK:-none}; exit 3"],
                             env={**os.environ, "PXSIM_MARK": "leak"}, capture_output=True,
                             text=True, timeout=60)
        assert (res.returncode, res.stdout.split()) == (3, ["h3", "none"]), res
        for cut in (False, True):
            ssh = subprocess.Popen([sim.ssh, "h3", "sleep 60"])
            sleeper = []
            assert_eventually(lambda: sleeper.extend(_sleepers(h3)) or sleeper)
            from procs import tree_pids

            assert not set(sleeper) & set(tree_pids(ssh.pid))
            if cut:
                h3.cut()
            ssh.kill()
            ssh.wait()
            # sshd hangs up on a closed connection (within seconds, on a loaded machine too);
            # a host cut off hears nothing
            if cut:
                time.sleep(1.0)
                assert _sleepers(h3)
            else:
                assert_eventually(lambda: not _sleepers(h3))
            h3.restore()
            for p in _sleepers(h3):
                os.kill(p, 9)
        for e in echoes:
            e.kill()
            e.wait()
    # nothing left: namespaces, links, processes, files
    assert _names(sim) == ([], [])
    assert not any(h.processes() for h in sim.hosts)
    assert not os.path.exists(sim.dir)


def _sleepers(host) -> list:
    return [p for p in host.job_processes()
            if open(f"/proc/{p}/cmdline").read() == "sleep\x0060\x00"]


def assert_eventually(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_unavailable_says_why_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in SimHosts.unavailable()
    with pytest.raises(ValueError, match="1 to 250 hosts"):
        SimHosts(0, "/tmp")


HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import simhosts
sim = simhosts.SimHosts(2, sys.argv[2]).__enter__()
print(sim.prefix, flush=True)
time.sleep(120)
"""


def test_a_fixture_killed_outright_is_cleaned_up_by_the_next(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, os.path.dirname(__file__),
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        prefix = holder.stdout.readline().strip()
        assert prefix.startswith("px")
    finally:
        holder.kill()                    # no close(): its hosts die with it, names remain
        holder.wait()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix in netns
    with SimHosts(1, str(tmp_path)):
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert prefix not in netns and prefix not in links
        assert not [d for d in os.listdir(tmp_path) if d.endswith(prefix[2:])]
