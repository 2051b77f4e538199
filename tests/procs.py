"""Finding the processes of one job among everything else running on the machine (other jobs
run at the same time): the job's processes inherit an environment marker, or share the session
of a job started with `run_in_session`."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import List, Optional

__all__ = ["marked_processes", "run_in_session", "session_processes", "wait_until",
           "listening_sockets", "session_pids", "mapped_files", "tree_pids"]


def marked_processes(var: str, tag: str) -> List[int]:
    """Pids of the live (not zombie) processes whose environment has `var=tag`."""
    want = f"{var}={tag}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as st:
                if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(name))
        except OSError:
            continue
    return found


def run_in_session(cmd: List[str], env: dict, cwd: Optional[str] = None,
                   timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `cmd` in a new session and wait (killing the whole session on timeout). The result
    has `.sid`, the session id that finds what the job left behind."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    res.sid = proc.pid
    return res


def session_processes(sid: int) -> List[str]:
    """`ps` lines of the live (not zombie) processes of session `sid`: a job started with
    `run_in_session` and everything it started (launcher, MPI ranks, Ray's processes)."""
    out = subprocess.run(["ps", "-eo", "pid,sid,stat,args"], capture_output=True,
                         text=True).stdout
    procs = []
    for line in out.splitlines()[1:]:
        pid, psid, stat, *args = line.split(None, 3)
        if int(psid) == sid and not stat.startswith("Z"):
            procs.append(line)
    return procs


def wait_until(condition, timeout: float = 30.0) -> bool:
    """Poll `condition` until it holds (process teardown takes a moment after a job's host
    exits); False if it still does not after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _socket_inodes(pid: int) -> set:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _tcp_address(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} (`0100007F:1F90`) as `127.0.0.1:8080` / `[::1]:8080`."""
    import ipaddress

    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:                                    # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return f"{ip}:{int(port, 16)}" if ip.version == 4 else f"[{ip}]:{int(port, 16)}"


def listening_sockets(pids) -> List[tuple]:
    """(address, pid) of every TCP socket in LISTEN state held by one of `pids` (read from
    /proc/net/tcp and tcp6, as `ss -ltnp` does)."""
    owner = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            owner.setdefault(inode, pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[9]) in owner:       # 0A: LISTEN
                found.append((_tcp_address(fields[1]), owner[int(fields[9])]))
    return found


def session_pids(sid: int) -> List[int]:
    """Pids of the live (not zombie) processes of session `sid` (see `session_processes`),
    read from /proc (fast enough to poll)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":      # state, ppid, pgrp, session
            found.append(int(name))
    return found


def mapped_files(pids, prefix: str) -> set:
    """Paths starting with `prefix` that any of `pids` maps (existing or already unlinked)."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            i = line.find(prefix)
            if i >= 0:
                found.add(line[i:].split()[0])
    return found


def tree_pids(root: int) -> List[int]:
    """`root` and every live descendant of it (hydra's proxies and ranks run in sessions of
    their own, so a session does not find them)."""
    children: dict = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out
