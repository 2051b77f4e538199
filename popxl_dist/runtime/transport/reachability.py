"""Whether the other hosts of a job can still be reached, and the error that says one cannot.

A host cut off from the network (its link down, or a crash) tells nobody: its sockets go silent.
The job's own sockets between hosts (the Ray backends' links) are therefore kept alive by the
kernel (`keep_alive`): while a connection is idle it sends a keepalive probe every second, and a
connection whose peer has answered nothing (no probe, no data acknowledged) for
`POPXL_PEER_TIMEOUT` seconds fails with ETIMEDOUT, even while the process computes (the kernel
does it). A peer process that dies on a reachable host is told at once instead (its kernel closes
the connection). `socket_error` reads a socket's state without reading from it, so a watchdog
thread can look at sockets that another thread uses. MPI jobs, whose sockets belong to MPI, send
heartbeats over MPI instead (`mpi_heartbeat.py`, beside this module).
"""
from __future__ import annotations

import errno
import math
import socket
import struct
from typing import Dict, Iterable, Optional, Tuple

from ...errors import HostUnreachable

__all__ = ["keep_alive", "socket_error", "is_unreachable", "host_unreachable", "hosts_of",
           "UNREACHABLE_ERRNOS"]

# Errors of a connection whose peer's host stopped answering (not: a process that ended).
UNREACHABLE_ERRNOS = frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                errno.EHOSTDOWN, errno.ENETDOWN})
_TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_TCP_ESTABLISHED, _TCP_CLOSE = 1, 7


def keep_alive(sock: socket.socket, timeout: float) -> None:
    """Make the kernel fail `sock` once its peer has answered nothing for about `timeout`
    seconds: a keepalive probe every second while idle, and sent data unacknowledged for
    `timeout` seconds (TCP_USER_TIMEOUT) ends the connection too. Linux; elsewhere only
    SO_KEEPALIVE with the system's timings."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1),
                        ("TCP_KEEPCNT", max(1, math.ceil(timeout)))):
        opt = getattr(socket, name, None)
        if opt is not None:
            sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, max(1, int(timeout * 1000)))
    except OSError:
        pass


def socket_error(sock: socket.socket) -> Optional[int]:
    """The errno that ended `sock`'s connection (ETIMEDOUT: its peer stopped answering), 0 if it
    ended without one (closed by the peer), None while it is open. Reads no data, so it may run
    beside a thread that uses the socket; the error it finds is taken from the socket (the
    caller keeps it)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)
    except OSError:
        return 0
    state = struct.unpack_from("B", info)[0]
    if state == _TCP_ESTABLISHED:
        return None
    if state != _TCP_CLOSE:
        return 0                       # the peer closed its side (FIN): it ended, not cut off
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError:
        return 0


def is_unreachable(err: Optional[int]) -> bool:
    return err is not None and err in UNREACHABLE_ERRNOS


def host_unreachable(hosts: Dict[str, str], members: Dict[int, Tuple[str, str]],
                     timeout: float, noun: str = "worker", when: str = "",
                     suffix: str = "", heartbeats: bool = False) -> HostUnreachable:
    """The error for `hosts` (host name -> address) that stopped answering. `members` maps each
    member (worker or instance) to (its host name, how to describe it, e.g. "Ray actor, pid
    12"); those on the unreachable hosts are named and listed in `err.workers`. With
    `heartbeats`, silence was judged from the processes' heartbeats (which stopped processes
    do not send either), else from the host's kernel (TCP keepalive)."""
    parts, lost = [], []
    for host in sorted(hosts):
        on = sorted(m for m, (h, _) in members.items() if h == host)
        lost += on
        who = ", ".join(f"{noun} {m} ({members[m][1]})" for m in on) or f"no {noun}"
        address = f" ({hosts[host]})" if hosts[host] and hosts[host] != host else ""
        why = (f"no heartbeat came from it for {timeout:g} s (POPXL_PEER_TIMEOUT; or its "
               f"processes are stopped)" if heartbeats else
               f"nothing came from it for {timeout:g} s (POPXL_PEER_TIMEOUT)")
        parts.append(f"host {host}{address} is unreachable: {why}; {who} on it "
                     f"{'is' if len(on) == 1 else 'are'} lost")
    err = HostUnreachable("; ".join(parts) + (f" {when}" if when else "") + suffix)
    err.workers = sorted(lost)
    err.hosts = sorted(hosts)
    err.host = err.hosts[0] if err.hosts else ""
    return err


def hosts_of(members: Iterable[int], procs: Dict[int, Tuple[str, int]],
             addresses: Optional[Dict[int, str]] = None) -> Dict[str, str]:
    """The hosts (name -> address) of `members`, from `procs` (member -> (host, pid))."""
    out: Dict[str, str] = {}
    for m in members:
        host = procs.get(m, ("?", 0))[0]
        out.setdefault(host, (addresses or {}).get(m, ""))
    return out
