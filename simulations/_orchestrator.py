"""A local deployment's processes, as ``simulations.deployment`` runs them and the tests drive
them (to kill and restart one): a SuperLink with TLS and SuperNode authentication, N
SuperNodes each with its own key, policy, state folder and pin shim (``DIR/nodes/<i>/``),
``flwr run`` of a frozen copy of the app, and each node's ε read back from its own ledger.
Every process goes through one ``simulations._processes.Processes``, stopped on ``close``.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from flwr.cli.build import build_fab_from_disk

from clients.pinned import app_digest, write_shim
from fedpriv.certificates import TlsFiles, write_node_key, write_tls
from fedpriv.federation.policy import load_policy, policy_file_text
from fedpriv.files import write_bytes_atomic
from fedpriv.node import init_nodes
from fedpriv.privacy import PrivacyLedger
from fedpriv.project import PROJECT_ROOT
from simulations._federated import consortium_policy
from simulations._netns import Network
from simulations._processes import (
    BIN,
    ProcessError,
    Processes,
    Started,
    base_env,
    free_port,
    healthy,
    superlink_command,
    supernode_command,
    write_flwr_config,
)

FEDERATION = "deployment"
"""The ``flwr`` CLI's name for this deployment's SuperLink (in ``DIR/flwr-home``)."""


@dataclass(frozen=True)
class NodeFiles:
    """Where one SuperNode's operator keeps its files."""

    folder: Path

    @property
    def key(self) -> Path:
        return self.folder / "auth.key"

    @property
    def public_key(self) -> Path:
        return self.folder / "auth.pub"

    @property
    def policy(self) -> Path:
        return self.folder / "policy.toml"

    @property
    def state(self) -> Path:
        return self.folder / "state"

    @property
    def bin(self) -> Path:
        """Holds the ``flwr-clientapp`` that checks the app pin (first on the node's PATH)."""
        return self.folder / "bin"

    @property
    def log(self) -> Path:
        return self.folder / "supernode.log"


def config_arg(config: Mapping[str, Any]) -> str:
    """``--run-config`` / ``--node-config`` text: TOML values, space-separated."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())


def freeze_app(folder: Path) -> str:
    """Copy the app bundle's files into ``folder`` (so edits to the checkout during the run
    change nothing) and return the digest of the bundle ``flwr run folder`` sends."""
    if folder.exists():
        shutil.rmtree(folder)
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(PROJECT_ROOT))) as bundle:
        bundle.extractall(folder, [n for n in bundle.namelist() if not n.startswith(".info/")])
    return app_digest(build_fab_from_disk(folder))


def node_policy(node: NodeFiles, epsilon_budget: float, delta_: float, app: str,
                data_dir: Path | None = None, mode: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a node's operator promises: its budget, own state, CSPRNG noise, the pinned app,
    the folder of its own data (``None``: its default cache folder), and the keys that let
    it take part in the run's privacy mode (``simulations._federated.mode_policy``)."""
    policy: dict[str, Any] = {"epsilon-budget": epsilon_budget, "delta": delta_, "state-dir": str(node.state),
                              "randomness": "secure", "trusted-apps": [app], **(mode or {})}
    if data_dir is not None:
        policy["data-dir"] = str(Path(data_dir).resolve())
    return policy


class Deployment:
    """A SuperLink and SuperNodes on this machine, as ``simulations.deployment`` runs them;
    the tests drive it directly to kill and restart its processes."""

    def __init__(self, out: Path, nodes: int, network: Network) -> None:
        self.out, self.num_nodes, self.network = out, nodes, network
        self.processes = Processes()
        self.env = base_env(out / "flwr-home")
        self.nodes = [NodeFiles(out / "nodes" / str(i)) for i in range(nodes)]
        self.superlink: Started | None = None
        self.supernodes: dict[int, Started] = {}

    def prepare(self, epsilon_budget: float, delta_: float, app: str, data_dir: Path | None = None,
                mode: Mapping[str, Any] | None = None) -> None:
        """Certificates and keys (kept across restarts), each node's policy (its data in
        ``data_dir``, ``mode`` its privacy mode's keys), its ledger where never initialised,
        and pin shim."""
        certs = self.out / "certs"
        if not (certs / "ca.key").exists():
            write_tls(certs, self.network.superlink_hosts)
        for i, node in enumerate(self.nodes):
            if not node.key.exists():
                key, public = write_node_key(node.folder, "auth")
                assert (key, public) == (node.key, node.public_key)
            write_shim(node.bin)
            policy = node_policy(node, epsilon_budget, delta_, app, data_dir, mode)
            if policy.get("allow-distributed"):  # the nodes' own consortium CA, not the SuperLink's
                policy |= consortium_policy(self.out / "consortium", range(self.num_nodes))
            write_bytes_atomic(node.policy, policy_file_text(policy).encode())
            init_nodes(node.policy, [i])  # `python -m fedpriv.node init`, once: a lost ledger stays lost

    @property
    def tls(self) -> TlsFiles:
        certs = self.out / "certs"
        return TlsFiles(certs / "ca.pem", certs / "ca.key", certs / "superlink.pem", certs / "superlink.key")

    def start_superlink(self, timeout: float = 90) -> None:
        """A fresh SuperLink (new database), healthy within ``timeout`` s, with every node's key registered."""
        folder = self.out / "superlink"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        port = free_port(self.network.superlink_host)
        self.address = f"{self.network.superlink_host}:{port}"
        write_flwr_config(self.out / "flwr-home", FEDERATION, self.address, self.tls)
        self.superlink = self.processes.start(
            "SuperLink", superlink_command(port, folder / "state.db", self.tls, supernode_auth=True,
                                           host=self.network.superlink_host), self.env, folder / "superlink.log")
        self.processes.wait_until(lambda: healthy(self.address, self.tls), self.superlink, timeout,
                                  "answer its health check")
        for node in self.nodes:
            self.flwr("supernode", "register", str(node.public_key), FEDERATION)

    def start_node(self, i: int) -> None:
        """SuperNode ``i`` with its policy file, its key, the CA and the pin shim first on PATH."""
        node = self.nodes[i]
        node_config = config_arg({"partition-id": i, "num-partitions": self.num_nodes, "policy": str(node.policy)})
        command = supernode_command(self.address, node_config, self.tls.ca_cert, key=node.key)
        env = {**self.env, "PATH": f"{node.bin}:{self.env['PATH']}"}
        self.supernodes[i] = self.processes.start(f"SuperNode {i}", self.network.wrap(i, command), env, node.log)

    def wait_online(self, count: int, timeout: float = 150) -> None:
        """Until exactly ``count`` SuperNodes are online at the SuperLink (``flwr supernode
        ls``). A killed node stays online there until it misses two heartbeats (about a
        minute), and a node cannot rejoin while its key is still online."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = json.loads(self.flwr("supernode", "ls", FEDERATION, "--format", "json"))["nodes"]
            online = sum(n["status"] == "online" for n in nodes)
            if online == count:
                return
            for i, started in self.supernodes.items():
                if started.process.poll() not in (None, -9, -15):
                    raise ProcessError(f"SuperNode {i} exited with code {started.process.returncode}; "
                                       f"log {started.log}:\n{started.tail()}")
            if time.monotonic() > deadline:
                raise ProcessError(f"{online} SuperNodes online, not {count}, after {timeout:.0f} s")
            time.sleep(0.5)

    def flwr(self, *command: str, timeout: float = 120) -> str:
        """A ``flwr`` CLI command against this deployment; its output, or ``ProcessError``."""
        done = subprocess.run([str(BIN / "flwr"), *command], env=self.env, cwd=self.out, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise ProcessError(f"flwr {' '.join(command)} failed ({done.returncode}): "
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    def start_run(self, app: Path, config: Mapping[str, Any], echo: TextIO | None = None) -> Any:
        """``flwr run`` of ``app`` with ``config``, streaming the run's log to ``DIR/run.log``
        (and to ``echo``, the terminal, as it comes)."""
        command = [str(BIN / "flwr"), "run", str(app), FEDERATION, "--run-config", config_arg(config), "--stream"]
        return self.processes.start("flwr run", command, self.env, self.out / "run.log", cwd=self.out, echo=echo)

    def node_epsilons(self, delta_: float) -> dict[str, dict[str, Any]]:
        """Each node's spent ε at ``delta_`` and entry count, read from its own ledger, and the
        trust model its policy books distributed rounds under (where it allows them)."""
        spent = {}
        for i, node in enumerate(self.nodes):
            path = node.state / "ledger.json"
            ledger = PrivacyLedger.load(path) if path.exists() else None
            entries = list(ledger.entries(str(i))) if ledger else []
            policy = load_policy({"policy": str(node.policy), "partition-id": i}, environ={})
            spent[str(i)] = {"epsilon": ledger.spent_at(str(i), delta_) if ledger and entries else 0.0,
                             "entries": entries, "ledger": str(path),
                             **({"secagg_trust": str(policy.secagg_trust)} if policy.allow_distributed else {})}
        return spent

    def close(self) -> None:
        self.processes.stop_all()
