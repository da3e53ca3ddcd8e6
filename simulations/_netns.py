"""Where a local deployment's SuperNodes sit on the network: on loopback, or each in its own
network namespace joined to the SuperLink's bridge by veth (``simulations.deployment --netns``;
root and ``ip netns`` permitting)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


class Network:
    """Where the SuperLink listens and how a SuperNode's command runs: on loopback, or in
    its own network namespace joined to a bridge by veth (``--netns``)."""

    superlink_host = "127.0.0.1"

    @property
    def superlink_hosts(self) -> list[str]:
        return [self.superlink_host]

    def wrap(self, i: int, command: list[str]) -> list[str]:
        return command


class NamespaceNetwork(Network):
    """A bridge ``fpbr<tag>`` at 10.77.0.1/24 on this host; SuperNode ``i`` in namespace
    ``fedpriv-<tag>-<i>`` at 10.77.0.(10 + i), its veth's other end on the bridge."""

    superlink_host = "10.77.0.1"

    def __init__(self, nodes: int, tag: str) -> None:
        self.nodes, self.tag = nodes, tag
        self.bridge = f"fpbr{tag}"

    @property
    def superlink_hosts(self) -> list[str]:
        return [self.superlink_host, "127.0.0.1"]

    def namespace(self, i: int) -> str:
        return f"fedpriv-{self.tag}-{i}"

    def wrap(self, i: int, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(i), *command]

    @contextmanager
    def up(self) -> Iterator[NamespaceNetwork]:
        taken = subprocess.run(["ip", "-o", "addr", "show", "to", f"{self.superlink_host}/32"],
                               capture_output=True, text=True).stdout.split()
        if taken:  # a second route to the subnet: the nodes' packets would not reach this bridge
            raise NetnsUnavailable(f"{self.superlink_host} is already on {taken[1]} (a bridge left by a killed "
                                   f"run? 'ip link del {taken[1]}' removes it)")
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.superlink_host}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.nodes):
                ns, host_end, node_end = self.namespace(i), f"fph{self.tag}{i}", f"fpn{self.tag}{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
                _ip("link", "set", node_end, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"10.77.0.{10 + i}/24", "dev", node_end)
                _ip("-n", ns, "link", "set", node_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            yield self
        finally:
            for i in range(self.nodes):
                subprocess.run(["ip", "netns", "del", self.namespace(i)], capture_output=True)
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class NetnsUnavailable(RuntimeError):
    """``ip netns`` cannot be used here (not root, no iproute2, or the kernel refuses)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")


def check_netns() -> str | None:
    """Why ``--netns`` cannot run here, or ``None`` if it can."""
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"fedpriv-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "'ip netns add' is not permitted here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None
