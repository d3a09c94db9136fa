"""The interface a multi-node job's ranks talk on, found from the kernel's route to a peer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch.slurm.network import (
    NetworkError,
    choose_interface,
    interface_addresses,
    route_to,
    set_interface,
)

ROOT = Path(__file__).resolve().parents[2]


def test_loopback_is_reached_through_lo() -> None:
    assert interface_addresses()["lo"] == "127.0.0.1"
    assert route_to("127.0.0.1") == ("lo", "127.0.0.1")


def test_a_peer_that_resolves_to_loopback_is_refused_naming_etc_hosts() -> None:
    with pytest.raises(NetworkError, match=r"localhost, another node .* resolves to 127\.0\.0\.1"):
        choose_interface(["node-a", "localhost"], "node-a")
    with pytest.raises(NetworkError, match="/etc/hosts"):
        set_interface({}, ["localhost", "node-b"], "node-b")


def test_interfaces_the_profile_sets_are_kept_without_a_lookup() -> None:
    env = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    line = set_interface(env, ["does-not-resolve.invalid", "me"], "me")
    assert env == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    assert line == "network interface as set: GLOO_SOCKET_IFNAME=ib0, NCCL_SOCKET_IFNAME=ib0"


def test_the_interface_routing_to_the_peer_is_chosen_over_one_listed_first() -> None:
    """In a network namespace of its own: veth `wrong0` (listed first, another subnet) and
    `right0`, whose subnet holds the peer. NCCL_SOCKET_IFNAME given by the profile is kept."""
    code = (
        "from launch.slurm.network import set_interface\n"
        "env = {'NCCL_SOCKET_IFNAME': 'ib9'}\n"
        "print(set_interface(env, ['10.77.0.9', 'me'], 'me'))\n"
        "print(env['GLOO_SOCKET_IFNAME'], env['NCCL_SOCKET_IFNAME'])\n"
    )
    setup = (
        "ip link set lo up && "
        "ip link add wrong0 type veth peer name wrong1 && ip addr add 10.66.0.1/24 dev wrong0 && "
        "ip link set wrong0 up && ip link set wrong1 up && "
        "ip link add right0 type veth peer name right1 && ip addr add 10.77.0.1/24 dev right0 && "
        "ip link set right0 up && ip link set right1 up && "
        f'exec {sys.executable} -c "$0"'
    )
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", setup, code],
        cwd=ROOT,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    line, chosen = proc.stdout.strip().splitlines()
    assert line == (
        "network interface right0 (10.77.0.1), the route to node 10.77.0.9 (10.77.0.9): "
        "GLOO_SOCKET_IFNAME=right0, NCCL_SOCKET_IFNAME=ib9 (as set)"
    )
    assert chosen == "right0 ib9"
