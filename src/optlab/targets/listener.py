"""The process behind an `http` target's URL when it listens on this host: the target's own
service, sampled as its process tree, never counted as a neighbour of the run.

Found by its port: the processes holding a listening socket on the URL's port at an address
that is this host's (a loopback address, one of its interfaces', or a wildcard). Several
processes hold it when a server forks workers that inherit the socket: the service is the one
whose parent is not among them (the master), or, when the listeners are siblings, their common
parent (of the same program: two unrelated servers sharing a port are not one service, the
oldest is taken). A process of another user cannot be seen (its sockets are not readable):
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
    pids: set[int] = set()
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or conn.pid is None or not conn.laddr:
            continue
        ip, at = _plain(str(conn.laddr.ip)), int(conn.laddr.port)
        if at == port and (ip in addresses or ip in WILDCARDS):
            pids.add(conn.pid)
    root = _root(pids)
    if root is None:
        return None
    return Listener(root.pid, _name(root), f"listening on {host}:{port}")


def _root(pids: set[int]) -> psutil.Process | None:
    """The process that owns the listening socket: the one whose parent does not hold it, or
    the common parent of several that each hold it; never optlab's process or an ancestor."""
    procs: list[psutil.Process] = []
    for pid in sorted(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    if not procs:
        return None
    tops: list[psutil.Process] = []
    for proc in procs:
        try:
            ppid = proc.ppid()
        except psutil.Error:
            continue
        if ppid not in pids:
            tops.append(proc)
    if not tops:
        return None
    tops.sort(key=_created)
    top = tops[0]  # unrelated listeners (SO_REUSEPORT): the oldest
    if len(tops) > 1:
        try:
            parents = {proc.ppid() for proc in tops}
            parent = psutil.Process(parents.pop()) if len(parents) == 1 else None
        except psutil.Error:
            parent = None
        if parent is not None and _name(parent) == _name(top):
            top = parent  # workers that a master started and that each hold the socket
    return None if _optlab_or_above(top.pid) else top


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
