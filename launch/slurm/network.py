"""The network interface the ranks of a multi-node job talk on: the one that reaches the others.

Left to themselves, gloo and NCCL guess. gloo takes the address the node's host name resolves
to, which is 127.0.1.1 wherever Debian's /etc/hosts maps the name there: the other nodes cannot
reach it, and the first collective hangs. NCCL takes the first interface it finds, which may be
a management network or docker0. So each node task of a multi-node job asks the kernel which
interface it routes to another node of the job through, and sets GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME to it, unless they are set already (the cluster profile's `env`, the shell).
A peer whose name resolves to a loopback address here is refused in one line naming /etc/hosts.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


class NetworkError(RuntimeError):
    """A node that cannot reach the others as configured: one line saying why."""


def ipv4(host: str) -> str:
    """The first IPv4 address `host` resolves to on this node."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NetworkError(f"host name {host} does not resolve on this node: {exc}") from None
    return str(infos[0][4][0])


def interface_addresses() -> dict[str, str]:
    """Every interface of this node that has an IPv4 address: name -> address."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address (or down)
            out[name] = socket.inet_ntoa(reply[20:24])
    return out


def route_to(address: str) -> tuple[str, str]:
    """(interface, source address) through which this node reaches IPv4 `address`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))  # a UDP connect sends nothing: the kernel only picks the route
        source = str(s.getsockname()[0])
    for name, held in interface_addresses().items():
        if held == source:
            return name, source
    raise NetworkError(f"no interface here holds {source}, the route to {address}'s source")


@dataclass(frozen=True)
class Choice:
    interface: str
    address: str
    peer: str
    peer_address: str


def choose_interface(nodes: Sequence[str], this_node: str) -> Choice:
    """The interface this node reaches another node of the job through: the first node from
    every other node, the second from the first."""
    peers = [n for n in nodes if n != this_node]
    if not peers:
        raise NetworkError(f"no other node than {this_node} in the job's node list {nodes}")
    peer = peers[0]
    peer_address = ipv4(peer)
    if ipaddress.ip_address(peer_address).is_loopback:
        raise NetworkError(
            f"host name {peer}, another node of this job, resolves to {peer_address} on node "
            f"{this_node}: its ranks could not reach it; map {peer} to its network address in "
            "/etc/hosts (or DNS) on every node"
        )
    interface, address = route_to(peer_address)
    return Choice(interface, address, peer, peer_address)


def set_interface(env: MutableMapping[str, str], nodes: Sequence[str], this_node: str) -> str:
    """Set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in `env` where unset; the line that says
    what was chosen (or kept), to print. NetworkError where no interface reaches the others."""
    given = {k: env[k] for k in IFNAME_VARS if env.get(k)}
    if len(given) == len(IFNAME_VARS):
        kept = ", ".join(f"{k}={v}" for k, v in given.items())
        return f"network interface as set: {kept}"
    choice = choose_interface(nodes, this_node)
    for key in IFNAME_VARS:
        if key not in given:
            env[key] = choice.interface
    how = ", ".join(f"{k}={env[k]}" + (" (as set)" if k in given else "") for k in IFNAME_VARS)
    return (
        f"network interface {choice.interface} ({choice.address}), the route to node "
        f"{choice.peer} ({choice.peer_address}): {how}"
    )
