"""The process behind an `http` target's URL when it listens on this host: the target's own
service, sampled as its process tree, never counted as a neighbour of the run.

Found by its port: the process holding a listening socket on the URL's port at an address
that is this host's (a loopback address, one of its interfaces', or a wildcard). Several
processes hold it when a server forks workers that inherit the socket: the service is their
master, the parent that holds it too or, when it closed its copy, the parent (of the same
program) of workers that hold it. Two unrelated servers sharing a port are not one service:
the oldest is taken. A process of another user cannot be seen (its sockets are not readable):
such a service is not found, and its CPU is counted with the other processes'.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil

__all__ = ["Listener", "local_listener"]

WILDCARDS = frozenset({"0.0.0.0", "::"})
ANCESTRY_DEPTH = 16  # how far up a server's processes are followed to their master


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    found_by: str  # how it was found: "listening on 127.0.0.1:8080"

    def info(self) -> dict[str, Any]:
        """As the run stores it under `service`."""
        return {"pid": self.pid, "name": self.name, "found_by": self.found_by}


def local_listener(url: str) -> Listener | None:
    """The service listening at `url`'s port on this host; None when the host is another
    machine, or the listener cannot be seen or is optlab's own process."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    addresses = {_plain(str(entry[4][0])) for entry in found}
    local = _local_addresses()
    if not addresses & local and not any(_loopback(a) for a in addresses):
        return None  # another machine: nothing of it to sample
    held: dict[int, str] = {}  # pid -> the listening socket it holds ("socket:[inode]")
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or conn.pid is None or not conn.laddr:
            continue
        ip, at = _plain(str(conn.laddr.ip)), int(conn.laddr.port)
        if at == port and (ip in addresses or ip in WILDCARDS):
            held[conn.pid] = _fd_target(conn.pid, conn.fd)
    roots = [r for pid, sock in held.items() if (r := _root(pid, sock)) is not None]
    if not roots:
        return None
    root = min(roots, key=_created)  # unrelated servers sharing the port: the oldest
    return Listener(root.pid, _name(root), f"listening on {host}:{port}")


def _root(pid: int, sock: str) -> psutil.Process | None:
    """The service that holds the listening socket `sock` in process `pid`: psutil names one
    holder, so the others are looked for around it. Its parent when that holds the socket too
    (a master whose workers inherited it), or when a sibling of the same program holds it (a
    master that closed its own copy); never optlab's process or one of its ancestors."""
    try:
        proc = psutil.Process(pid)
        for _ in range(ANCESTRY_DEPTH):
            parent = proc.parent()
            if parent is None or _optlab_or_above(parent.pid):
                break  # the service is below optlab, never optlab or what runs it
            if sock and _holds(parent.pid, sock):
                proc = parent
                continue
            if sock and _name(parent) == _name(proc):
                siblings = [c for c in parent.children() if c.pid != proc.pid]
                if any(_holds(c.pid, sock) for c in siblings):
                    proc = parent
            break
    except psutil.Error:
        return None
    return None if _optlab_or_above(proc.pid) else proc


def _fd_target(pid: int, fd: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}") if fd >= 0 else ""
    except OSError:
        return ""


def _holds(pid: int, sock: str) -> bool:
    """Whether process `pid` has `sock` among its open files (False when unreadable)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    return any(_fd_target(pid, int(fd)) == sock for fd in fds if fd.isdigit())


def _optlab_or_above(pid: int) -> bool:
    """Whether `pid` is optlab's own process or one of its ancestors: an in-process server,
    or a parent that runs optlab too, is not a service apart from optlab."""
    if pid <= 1:
        return True
    try:
        above = {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        above = set()
    return pid == os.getpid() or pid in above


def _created(proc: psutil.Process) -> float:
    try:
        return float(proc.create_time())
    except psutil.Error:
        return float("inf")


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


def _plain(address: str) -> str:
    """An address without its IPv6 zone and as IPv4 when it is IPv4-mapped."""
    address = address.split("%", 1)[0]
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _local_addresses() -> set[str]:
    try:
        interfaces = psutil.net_if_addrs()
    except (psutil.Error, OSError):
        return set()
    return {
        _plain(str(entry.address))
        for entries in interfaces.values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    }
