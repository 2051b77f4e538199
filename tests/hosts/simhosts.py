"""Simulated hosts on one machine, for the tests of jobs that span hosts (Ray clusters, MPI
across hosts, partitions, latency, outsiders).

A host is a process (its "init", `sleep`) holding new network, UTS and mount namespaces:

* its own address on a private /24 chosen for the fixture, on a veth pair whose other end is
  a port of the fixture's switch (`simswitch.py`: a user-space switch, which can delay and drop
  frames; this kernel has no netem);
* its own name (`h1`, `h2`, ...: what `hostname` / `socket.gethostname()` say there), and
  names that resolve: every host's `/etc/hosts` lists every host of the fixture;
* its own `/dev/shm` (a new tmpfs), System V IPC, boot id (`/proc/sys/kernel/random/boot_id`:
  UCX takes processes with one boot id for processes of one machine, and would join them
  through shared memory) and `/tmp` (a directory of the fixture's, with the paths under /tmp
  that must stay visible, the fixture's own folder and this Python's, bound at their places);
* a command runner: `host.run(argv)` / `host.popen(argv)`, and `ssh` (a script with ssh's
  command line: `ssh [options] HOST COMMAND...`) for process managers that start processes on
  other hosts (hydra's `-launcher-exec`). Like ssh, it gives the command a fresh login
  environment (no variables of the caller's), and the command is no descendant of the calling
  process (`ssh-remote.sh`): nothing on the calling host reaches it through the process tree,
  and it hears of the caller's end only while its host is on the network.

Everything has names with the fixture's unique prefix, and `close()` (always called: a context
manager) kills every process in every host's network namespace, deletes the links and
namespace names, stops the switch and removes the fixture's folder. A fixture whose process
was killed outright (no `close()`) loses its hosts' processes with it (they die with their
parent); the next fixture removes its names and folder (registered in /run/simhosts). Every
wait is bounded.
Only namespaces and links the fixture made are ever touched; traffic goes only between them.

`SimHosts.unavailable()` says why the machine cannot run them (not root, no `ip`, no
`unshare`/`nsenter`, no packet sockets), for a skip reason.

Example:
    with SimHosts(3, base) as hosts:
        h1, h2 = hosts[0], hosts[1]
        h1.run(["python", "-c", "import socket; print(socket.gethostname())"])  # h1
        hosts.shape(delay=0.02, loss=0.01)         # every frame: 20 ms late, 1% dropped
        h2.cut()                                   # h2's link down
"""
from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Sequence

__all__ = ["SimHosts", "Host", "HOST_LIFETIME"]

HERE = os.path.dirname(os.path.abspath(__file__))
HOST_LIFETIME = 3600            # seconds a host's init lives at most (if nobody closes it)
REGISTRY = "/run/simhosts"      # one file per live fixture: its prefix -> creator pid, folder
_LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INIT = r"""
set -e
hostname "$1"
mount -t tmpfs -o mode=1777 pxshm /dev/shm
mount --bind "$2" /etc/hosts
mount --bind "$3" /proc/sys/kernel/random/boot_id
tmp="$4"; shift 4
for keep in "$@"; do mkdir -p "$tmp/$keep"; mount --bind "/tmp/$keep" "$tmp/$keep"; done
mount --rbind "$tmp" /tmp
echo ready
exec sleep """ + str(HOST_LIFETIME)


# The ssh stand-in (`SimHosts.ssh`); its far end, run in the host, is ssh-remote.sh.
_SSH = """#!/bin/sh
# ssh [options] HOST COMMAND...: COMMAND run by `sh -c` in simulated host HOST, in a login
# environment (as ssh gives: no variable of the caller's, no signal ignored even where the
# caller runs in the background or under nohup), in HOME. The simulated hosts' ssh.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
host=$1; shift
case "$host" in
{cases}
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255;;
esac
exec nsenter -t $pid -n -u -m --wd="${{HOME:-/}}" -- env -i --default-signal HOME="${{HOME:-/}}" \\
  USER="${{USER:-root}}" LOGNAME="${{USER:-root}}" SHELL=/bin/sh PATH={path} \\
  {remote} "$*"
"""

def _ip(*args: str, ns_pid: Optional[int] = None, check: bool = True) -> str:
    cmd = ["ip", *args]
    if ns_pid is not None:
        cmd = ["nsenter", "-t", str(ns_pid), "-n", "--", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def _net_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _reap_stale() -> None:
    """Remove what fixtures whose process ended without closing them left (killed outright:
    their hosts' processes died with them, their namespace names, links and folder remain):
    only names of fixtures registered here."""
    try:
        entries = os.listdir(REGISTRY)
    except OSError:
        return
    netns = _ip("netns", "list", check=False).split()
    links = [line.split(": ")[1].split("@")[0] for line in
             _ip("-o", "link", check=False).splitlines() if ": " in line]
    for prefix in entries:
        path = os.path.join(REGISTRY, prefix)
        try:
            with open(path) as f:
                pid, start, folder = f.read().split()
        except (OSError, ValueError):
            continue
        if _start_time(int(pid)) == start:
            continue                                  # its creator still runs
        for name in netns:
            if name.startswith(prefix + "-"):
                _ip("netns", "delete", name, check=False)
        for name in links:
            if name.startswith(prefix):
                _ip("link", "delete", name, check=False)
        shutil.rmtree(folder, ignore_errors=True)
        os.unlink(path)


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG


class Host:
    """One simulated host (see module doc)."""

    def __init__(self, sim: "SimHosts", index: int):
        self.sim = sim
        self.index = index
        self.name = f"h{index + 1}"
        self.address = f"{sim.subnet}.{index + 1}"
        self.link = f"{sim.prefix}h{index + 1}"          # the switch's end of its veth pair
        self.netns = f"{sim.prefix}-{self.name}"
        self.tmp = os.path.join(sim.dir, self.name, "tmp")
        self.init: Optional[subprocess.Popen] = None
        self.ns = ""                                    # its network namespace, as /proc says

    def __repr__(self) -> str:
        return f"<host {self.name} {self.address}>"

    @property
    def pid(self) -> int:
        return self.init.pid

    def _start(self) -> None:
        os.makedirs(self.tmp)
        boot_id = os.path.join(self.sim.dir, self.name, "boot_id")
        with open(boot_id, "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        peer = f"{self.link}p"
        _ip("link", "add", self.link, "type", "veth", "peer", "name", peer)
        self.init = subprocess.Popen(
            ["unshare", "--net", "--mount", "--uts", "--ipc", "--propagation", "private", "--",
             "sh", "-c", _INIT, "sh", self.name, self.sim.hosts_file, boot_id, self.tmp,
             *self.sim.keep],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=_die_with_parent)
        line = self.init.stdout.readline()            # bounded: the script exits on error
        if line.strip() != "ready":
            raise RuntimeError(f"host {self.name} did not start: {line}{self.init.stderr.read()}")
        self.ns = _net_ns(self.pid)
        _ip("link", "set", peer, "netns", str(self.pid))
        _ip("netns", "attach", self.netns, str(self.pid))
        for args in (("link", "set", peer, "name", "eth0"),
                     ("addr", "add", f"{self.address}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"), ("link", "set", "lo", "up"),
                     # a default route: programs that find their address by routing towards
                     # the Internet (Ray does) find this one; nothing gets past the switch
                     ("route", "add", "default", "dev", "eth0")):
            _ip(*args, ns_pid=self.pid)
        _ip("link", "set", self.link, "up")

    # --- running commands ---------------------------------------------------------------
    def command(self, argv: Sequence[str], cwd: Optional[str] = None) -> List[str]:
        """`argv` as a command that runs in this host, in `cwd` (default: the caller's), with
        the caller's environment (see `SimHosts.ssh` for a login environment)."""
        return ["nsenter", "-t", str(self.pid), "-n", "-u", "-m",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start `argv` in this host (`subprocess.Popen` keywords; `cwd` is honoured)."""
        return subprocess.Popen(self.command(argv, kw.pop("cwd", None)), **kw)

    def run(self, argv: Sequence[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run `argv` in this host to completion (output captured as text)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(argv, kw.pop("cwd", None)), timeout=timeout, **kw)

    def processes(self) -> List[int]:
        """Pids of every live process in this host (its init included)."""
        found = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            if self.ns and _net_ns(int(name)) == self.ns:
                try:
                    with open(f"/proc/{name}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(name))
                except OSError:
                    continue
        return found

    def job_processes(self) -> List[int]:
        """The processes of this host that tests started (all but its init)."""
        return [p for p in self.processes() if p != self.pid]

    # --- faults -------------------------------------------------------------------------
    def cut(self) -> None:
        """Take this host's link down at the switch (the cable pulled: nothing reaches it,
        nothing it sends gets anywhere; nobody is told)."""
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")

    def kill_all(self, sig: int = signal.SIGKILL, keep_init: bool = True) -> List[int]:
        """Send `sig` to every process of this host (but its init); their pids."""
        pids = [p for p in self.processes() if not (keep_init and p == self.pid)]
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        return pids

    def _close(self) -> None:
        if self.init is not None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if not self.kill_all(keep_init=False):
                    break
                time.sleep(0.05)
            self.init.wait(timeout=15)
            for f in (self.init.stdout, self.init.stderr):
                f.close()
        _ip("netns", "delete", self.netns, check=False)
        _ip("link", "delete", self.link, check=False)


class SimHosts:
    """`n` simulated hosts `h1`..`hn` on one switch (see module doc).

    Args:
        n: the number of hosts.
        base: a folder for the fixture's files (its own subfolder is made and removed).
        keep: extra paths under /tmp the hosts must see (the fixture's folder, this Python and
            the current directory are kept anyway).
    """

    def __init__(self, n: int, base: str, keep: Sequence[str] = ()):
        if n < 1 or n > 250:
            raise ValueError(f"SimHosts: 1 to 250 hosts, got {n}")
        token = secrets.token_hex(3)
        self.prefix = f"px{token}"                     # 8 characters: names stay <= 15
        self.subnet = f"10.{random.randint(64, 250)}.{random.randint(0, 255)}"
        self.dir = os.path.join(os.path.abspath(base), f"simhosts-{token}")
        self.shared = os.path.join(self.dir, "shared")  # the same folder on every host
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.ssh = os.path.join(self.dir, "ssh")
        self.keep = self._kept([self.dir, sys.prefix, sys.base_prefix, os.getcwd(), *keep])
        self.hosts = [Host(self, i) for i in range(n)]
        self.switch: Optional[subprocess.Popen] = None

    @staticmethod
    def _kept(paths: Sequence[str]) -> List[str]:
        """The names of the top-level folders of /tmp that `paths` are in (bound into every
        host's /tmp)."""
        tops = set()
        for p in paths:
            parts = os.path.realpath(p).split(os.sep)
            if len(parts) > 2 and parts[1] == "tmp":
                tops.add(parts[2])
        return sorted(tops)

    @staticmethod
    def unavailable() -> str:
        """Why simulated hosts cannot run here ('' when they can)."""
        if os.geteuid() != 0:
            return "simulated hosts need root (network namespaces, veth pairs, mounts)"
        for tool in ("ip", "unshare", "nsenter", "mount"):
            if shutil.which(tool) is None:
                return f"simulated hosts need `{tool}`, which is not installed"
        import socket

        try:
            socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
        except (OSError, AttributeError) as e:
            return f"simulated hosts need packet sockets (the switch): {e}"
        return ""

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def by_name(self, name: str) -> Host:
        return next(h for h in self.hosts if name in (h.name, h.address))

    # --- set-up -------------------------------------------------------------------------
    def __enter__(self) -> "SimHosts":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        _reap_stale()
        os.makedirs(REGISTRY, exist_ok=True)
        with open(os.path.join(REGISTRY, self.prefix), "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())} {self.dir}\n")
        os.makedirs(self.shared)
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
            for h in self.hosts:
                f.write(f"{h.address}\t{h.name}\n")
        for h in self.hosts:
            h._start()
        self.switch = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "simswitch.py"), *(h.link for h in self.hosts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent)
        if self.switch.stdout.readline().strip() != "ready":
            raise RuntimeError("the switch of the simulated hosts did not start")
        self._write_ssh()

    def _write_ssh(self) -> None:
        cases = "\n".join(f"  {h.name}|{h.address}) pid={h.pid};;" for h in self.hosts)
        with open(self.ssh, "w") as f:
            f.write(_SSH.format(cases=cases, remote=os.path.join(HERE, "ssh-remote.sh"),
                                path=_LOGIN_PATH))
        os.chmod(self.ssh, 0o755)

    # --- the network --------------------------------------------------------------------
    def shape(self, delay: float = 0.0, loss: float = 0.0) -> None:
        """Delay every frame by `delay` seconds and drop it with probability `loss`, on its
        way out of the host that sent it (0, 0: no shaping)."""
        if not 0 <= loss < 1 or delay < 0:
            raise ValueError(f"shape: delay >= 0 and 0 <= loss < 1, got {delay}, {loss}")
        self._ask(f"shape {delay} {loss}")

    def stats(self) -> Dict[str, int]:
        """Frames the switch forwarded and dropped so far."""
        _, forwarded, dropped = self._ask("stats").split()
        return {"forwarded": int(forwarded), "dropped": int(dropped)}

    def _ask(self, line: str) -> str:
        self.switch.stdin.write(line + "\n")
        self.switch.stdin.flush()
        answer = self.switch.stdout.readline().strip()
        if answer.startswith("error") or not answer:
            raise RuntimeError(f"switch: {line!r}: {answer or 'no answer'}")
        return answer

    # --- teardown -----------------------------------------------------------------------
    def processes(self) -> Dict[str, List[int]]:
        """The test-started processes of every host, by host name."""
        return {h.name: h.job_processes() for h in self.hosts}

    def close(self) -> None:
        """Kill everything in the hosts, delete their links and names, stop the switch."""
        errors = []
        for h in self.hosts:
            try:
                h._close()
            except Exception as e:  # noqa: BLE001 - tear down the rest anyway
                errors.append(f"{h.name}: {e}")
        if self.switch is not None:
            try:
                self.switch.stdin.close()
                self.switch.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.switch.kill()
                self.switch.wait(timeout=10)
            self.switch.stdout.close()
            self.switch = None
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.unlink(os.path.join(REGISTRY, self.prefix))
        except OSError:
            pass
        if errors:
            raise RuntimeError(f"simulated hosts teardown: {errors}")
