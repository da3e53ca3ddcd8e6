"""A network-namespace deployment refuses to start over a bridge that already holds the
SuperLink's address (left by a killed run): a second route to the subnet would leave its
SuperNodes unable to reach the SuperLink, and the run would wait out its start window."""

import os
import subprocess

import pytest

from simulations._netns import NamespaceNetwork, NetnsUnavailable, check_netns


def test_a_leftover_bridge_with_the_superlinks_address_is_named_before_anything_starts():
    if reason := check_netns():
        pytest.skip(f"needs network namespaces: {reason}")
    leftover = f"fpbrx{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", leftover, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{NamespaceNetwork.superlink_host}/24", "dev", leftover], check=True)
        network = NamespaceNetwork(1, f"y{os.getpid() % 10000}")
        with pytest.raises(NetnsUnavailable, match=f"already on {leftover}"), network.up():
            pass
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert network.namespace(0) not in namespaces
    finally:
        subprocess.run(["ip", "link", "del", leftover], capture_output=True)
