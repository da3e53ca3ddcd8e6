"""A real deployment on this machine: ``python -m simulations.deployment --nodes 2 --rounds 2 --out DIR``.

Starts, as separate processes on 127.0.0.1:

- a SuperLink with TLS (a CA and its certificate, made in ``DIR/certs``) and SuperNode
  authentication;
- N SuperNodes, each with its own key (registered with the SuperLink), state folder and
  privacy policy (``DIR/nodes/<i>/``), and each running only the app bundle its policy pins;

then runs the app with ``flwr run`` from a frozen copy of it (``DIR/app``), and writes the
server's ``DIR/results.json`` and ``DIR/nodes.json`` (each node's ε, read from its own
ledger ``DIR/nodes/<i>/state/ledger.json``). Every process it started is stopped by PID on
the way out, also on Ctrl-C or SIGTERM. ``--netns`` puts each SuperNode in its own network
namespace joined to the SuperLink by veth (root and ``ip netns`` permitting).
``--resume`` continues a run whose SuperLink or ServerApp died, from the server's last
checkpoint in ``DIR/server``. See docs/deployment.md for the same steps on real machines.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fedpriv.project import PROJECT_ROOT
from simulations._cli import (
    USER_LEVEL_FLAGS,
    Parser,
    add_user_level,
    at_least,
    delta,
    even_or_zero,
    non_negative,
    positive,
)

if TYPE_CHECKING:
    from simulations._processes import Started

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


def build_parser() -> Parser:
    p = Parser(prog="python -m simulations.deployment", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=at_least(1), required=True, help="SuperNodes to start")
    p.add_argument("--rounds", type=at_least(1), required=True, help="federated rounds")
    p.add_argument("--min-clients", type=at_least(1), help="nodes the server waits for (default: --nodes)")
    noise = p.add_mutually_exclusive_group()
    noise.add_argument("--target-epsilon", type=positive,
                       help="the server calibrates σ so each node (user level: each client, in the server's "
                            "population ledger) ends at ≤ ε (default: 1, unless --noise-multiplier)")
    noise.add_argument("--noise-multiplier", type=non_negative,
                       help="a fixed σ (user level: z) instead of calibrating one to --target-epsilon")
    p.add_argument("--delta", type=delta, default=1e-5, help="δ (default: 1e-5)")
    p.add_argument("--node-epsilon-budget", type=positive,
                   help="record-level ε budget in each node's own policy (default: --target-epsilon; needed with "
                        "--noise-multiplier and with --privacy user, where a node's ledger books z/2 per round it "
                        "takes part in, not the clients' user-level ε)")
    p.add_argument("--limit-train", type=at_least(1), help="use the first N MNIST training examples (default: all)")
    p.add_argument("--limit-test", type=at_least(1), default=1000, help="test examples (default: 1000)")
    p.add_argument("--data-dir", help="folder holding MNIST in torchvision's layout, the server's and each "
                                     "node's policy data-dir (default: the cache)")
    p.add_argument("--download", action="store_true", help="download MNIST first if it is missing")
    p.add_argument("--seed", type=int, default=0, help="the server's sampling, partitions and model init")
    p.add_argument("--round-timeout", type=positive, default=600.0,
                   help="seconds a round waits for replies; later nodes failed the round (default: 600)")
    p.add_argument("--privacy", choices=["local", "distributed", "user"], default="local",
                   help="local: each node noises its update; distributed: integer noise shares under secure "
                        "aggregation, every node's policy allowing it with min-cohort = --nodes; user: user-level "
                        "DP-FedAvg (docs/user-level.md) with --user-noise central, where every node's operator opts "
                        "in to trusting the server with the noise (allow-central-user = true: its clipped delta "
                        "leaves un-noised), or distributed, every node's policy allowing integer noise shares under "
                        "secure aggregation with min-cohort = ⌈cohort / 2⌉ (default: local)")
    p.add_argument("--secagg-neighbours", type=even_or_zero, metavar="K", default=0,
                   help="distributed mode: SecAgg+ with K neighbours per node (even), every node's policy "
                        "accepting K (min-secagg-neighbours); 0: all others (default: 0)")
    add_user_level(p)
    p.add_argument("--netns", action="store_true", help="each SuperNode in its own network namespace")
    p.add_argument("--resume", action="store_true", help="continue the run in DIR from its last checkpoint")
    p.add_argument("--out", required=True, type=Path, help="deployment folder: certificates, keys, states, results")
    return p


def run_config(args: Any, out: Path) -> dict[str, Any]:
    """The run config ``flwr run`` sends (the server's settings, not the nodes' policies)."""
    config: dict[str, Any] = {
        "dataset": "mnist", "rounds": args.rounds, "min-clients": args.min_clients or args.nodes,
        "delta": args.delta, "seed": args.seed,
        "limit-test": args.limit_test, "out": str(out), "state-dir": str(out / "server"), "resume": args.resume,
        "round-timeout": args.round_timeout, "privacy": args.privacy, "secagg-neighbours": args.secagg_neighbours,
    }
    for key in ("target-epsilon", "noise-multiplier", *USER_LEVEL_FLAGS):
        if (value := getattr(args, key.replace("-", "_"))) is not None:
            config[key] = value
    if args.limit_train:
        config["limit-train"] = args.limit_train
    if args.data_dir:
        config["data-dir"] = str(Path(args.data_dir).resolve())
    return config


def config_arg(config: Mapping[str, Any]) -> str:
    """``--run-config`` / ``--node-config`` text: TOML values, space-separated."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())


def freeze_app(folder: Path) -> str:
    """Copy the app bundle's files into ``folder`` (so edits to the checkout during the run
    change nothing) and return the digest of the bundle ``flwr run folder`` sends."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    from clients.pinned import app_digest

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
        from simulations._processes import Processes, base_env

        self.out, self.num_nodes, self.network = out, nodes, network
        self.processes = Processes()
        self.env = base_env(out / "flwr-home")
        self.nodes = [NodeFiles(out / "nodes" / str(i)) for i in range(nodes)]
        self.superlink: Started | None = None
        self.supernodes: dict[int, Any] = {}

    def prepare(self, epsilon_budget: float, delta_: float, app: str, data_dir: Path | None = None,
                mode: Mapping[str, Any] | None = None) -> None:
        """Certificates and keys (kept across restarts), each node's policy (its data in
        ``data_dir``, ``mode`` its privacy mode's keys), its ledger where never initialised,
        and pin shim."""
        from clients.pinned import write_shim
        from fedpriv.certificates import write_node_key, write_tls
        from fedpriv.federation.policy import policy_file_text
        from fedpriv.files import write_bytes_atomic
        from fedpriv.node import init_nodes
        from simulations._federated import consortium_policy

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
    def tls(self) -> Any:
        from fedpriv.certificates import TlsFiles

        certs = self.out / "certs"
        return TlsFiles(certs / "ca.pem", certs / "ca.key", certs / "superlink.pem", certs / "superlink.key")

    def start_superlink(self, timeout: float = 90) -> None:
        """A fresh SuperLink (new database), healthy within ``timeout`` s, with every node's key registered."""
        from simulations._processes import free_port, healthy, superlink_command, write_flwr_config

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
        from simulations._processes import supernode_command

        node = self.nodes[i]
        node_config = config_arg({"partition-id": i, "num-partitions": self.num_nodes, "policy": str(node.policy)})
        command = supernode_command(self.address, node_config, self.tls.ca_cert, key=node.key)
        env = {**self.env, "PATH": f"{node.bin}:{self.env['PATH']}"}
        self.supernodes[i] = self.processes.start(f"SuperNode {i}", self.network.wrap(i, command), env, node.log)

    def wait_online(self, count: int, timeout: float = 150) -> None:
        """Until exactly ``count`` SuperNodes are online at the SuperLink (``flwr supernode
        ls``). A killed node stays online there until it misses two heartbeats (about a
        minute), and a node cannot rejoin while its key is still online."""
        import time

        from simulations._processes import ProcessError

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
        from simulations._processes import BIN, ProcessError

        done = subprocess.run([str(BIN / "flwr"), *command], env=self.env, cwd=self.out, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise ProcessError(f"flwr {' '.join(command)} failed ({done.returncode}): "
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    def start_run(self, app: Path, config: Mapping[str, Any], echo: TextIO | None = None) -> Any:
        """``flwr run`` of ``app`` with ``config``, streaming the run's log to ``DIR/run.log``
        (and to ``echo``, the terminal, as it comes)."""
        from simulations._processes import BIN

        command = [str(BIN / "flwr"), "run", str(app), FEDERATION, "--run-config", config_arg(config), "--stream"]
        return self.processes.start("flwr run", command, self.env, self.out / "run.log", cwd=self.out, echo=echo)

    def node_epsilons(self, delta_: float) -> dict[str, dict[str, Any]]:
        """Each node's spent ε at ``delta_`` and entry count, read from its own ledger, and the
        trust model its policy books distributed rounds under (where it allows them)."""
        from fedpriv.federation.policy import load_policy
        from fedpriv.privacy import PrivacyLedger

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
    import os

    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"fedpriv-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "'ip netns add' is not permitted here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def summary(results: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], target: float | None, out: Path,
            budget: float | None = None) -> str:
    """What the run did: rounds and the trained model's test accuracy (none without a round:
    the initial model is no result), then each node's ε from its own ledger beside the target
    and the server's count, and everything in ``out``. In user level (``resolved.user_level``)
    the two are different guarantees, each labelled: a node's record-level ε in its own
    ledger, beside its budget, and a client's user-level ε in the server's population ledger."""
    from server.history import epsilon_text

    accuracy = results.get("final_accuracy") if results.get("rounds") else None
    server = results.get("final_epsilon", {})
    lines = [f"rounds run: {len(results.get('rounds', []))}"
             + (f" (stopped: {results['stopped']})" if results.get("stopped") else "")
             + ", test accuracy: " + ("none, no round was trained" if accuracy is None else f"{100 * accuracy:.2f} %")]
    of = f" of target {target:g}" if target is not None else ""
    if (user := (results.get("resolved") or {}).get("user_level")) is not None:
        lines += [f"node {client}: record-level ε = {epsilon_text(node['epsilon'])}"
                  + (f" of budget {budget:g}" if budget is not None else "")
                  + f" in its own ledger ({len(node['entries'])} entries); client {client}: user-level "
                  f"ε = {epsilon_text(float(server.get(client, 0.0)))}{of} in the server's population ledger "
                  f"(z = {user['noise_multiplier']:g}, q = {user['sample_rate']:g})"
                  for client, node in nodes.items()]
    else:
        lines += [f"node {client}: ε = {epsilon_text(node['epsilon'])}{of} in its own ledger "
                  f"({len(node['entries'])} entries); the server's ledger: "
                  f"ε = {epsilon_text(float(server.get(client, 0.0)))}"
                  for client, node in nodes.items()]
    from fedpriv.federation.policy import SecAggTrust

    lines += [f"node {client}: distributed rounds booked under {SecAggTrust(node['secagg_trust']).described}"
              for client, node in nodes.items() if "secagg_trust" in node]
    entries = sorted(out.iterdir(), key=lambda path: (path.is_dir(), path.name))
    lines.append(f"written to {out}: " + ", ".join(path.name + "/" * path.is_dir() for path in entries)
                 + f"; each node's ledger: {out / 'nodes'}/<i>/state/ledger.json")
    return "\n".join(lines)


def progress(message: str) -> None:
    """A stage of the deployment, on the terminal as it starts."""
    print(f"python -m simulations.deployment: {message}", flush=True)


def node_budget(parser: Parser, args: Any) -> float:
    """Each node's record-level ε budget: ``--node-epsilon-budget``, else the target ε where
    that is the nodes' (not in user level, where it is the clients')."""
    if args.node_epsilon_budget:
        return float(args.node_epsilon_budget)
    if args.privacy == "user" or args.target_epsilon is None:
        parser.error("--node-epsilon-budget is needed with " + ("--privacy user: a node's ledger books z/2 per "
                     "round it takes part in, not the clients' user-level ε" if args.privacy == "user" else
                     "--noise-multiplier: no target ε to default to"))
    return float(args.target_epsilon)


def checked_run_config(parser: Parser, args: Any, out: Path) -> dict[str, Any]:
    """``run_config`` fused with pyproject's defaults, as the apps will read it; a value they
    would refuse (``RunSettings``) is one ``parser.error`` line naming its flag."""
    from flwr.common.config import get_fused_config_from_dir

    from fedpriv.federation.settings import RunSettings
    from simulations._cli import FLAGS, flag_message

    fused = get_fused_config_from_dir(PROJECT_ROOT, run_config(args, out))
    try:
        RunSettings.from_run_config(fused)
    except ValueError as err:
        parser.error(flag_message(str(err), FLAGS | {"min-clients": "--min-clients"}))
    return fused


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.target_epsilon is None and args.noise_multiplier is None:
        args.target_epsilon = 1.0
    if args.min_clients and args.min_clients > args.nodes:
        parser.error(f"--min-clients {args.min_clients} is more than --nodes {args.nodes}")
    budget = node_budget(parser, args)
    out = args.out.resolve()
    if args.resume and not (out / "server").exists():
        parser.error(f"--resume: {out / 'server'} holds no run to continue")
    from fedpriv.data import DatasetNotFoundError, check_available

    try:  # one line now, rather than each node failing once the processes are up
        check_available("mnist", args.data_dir, args.download)
    except DatasetNotFoundError as err:
        parser.error(str(err))
    if args.netns and (reason := check_netns()):
        print(f"python -m simulations.deployment: --netns skipped: {reason}; running on loopback", file=sys.stderr)
        args.netns = False
    from simulations._processes import ProcessError, terminate_as_interrupt

    fused = checked_run_config(parser, args, out)
    from simulations._federated import mode_policy

    out.mkdir(parents=True, exist_ok=True)
    config = run_config(args, out)
    with ExitStack() as stack:
        stack.enter_context(terminate_as_interrupt())
        network: Network = Network()
        if args.netns:
            import os

            network = stack.enter_context(NamespaceNetwork(args.nodes, str(os.getpid() % 100000)).up())
        deployment = Deployment(out, args.nodes, network)
        stack.callback(deployment.close)
        app = freeze_app(out / "app")
        deployment.prepare(budget, args.delta, app, Path(args.data_dir) if args.data_dir else None,
                           mode_policy(fused, args.nodes))
        try:
            progress(f"starting the SuperLink (TLS, node authentication) and {args.nodes} SuperNodes; their logs: "
                     f"{out / 'superlink'}, {out / 'nodes'}/<i>/supernode.log")
            deployment.start_superlink()
            for i in range(args.nodes):
                deployment.start_node(i)
            deployment.wait_online(args.nodes)
            progress(f"{args.nodes} SuperNodes online; flwr run: the run's log follows (also in {out / 'run.log'})")
            run = deployment.start_run(out / "app", config, echo=sys.stdout)
            code = deployment.processes.wait(run)
        except ProcessError as err:
            raise SystemExit(f"python -m simulations.deployment: {err}") from None
        if code != 0 or not (out / "results.json").exists():
            raise SystemExit(f"python -m simulations.deployment: flwr run exited with {code}; see {out / 'run.log'}:\n"
                             f"{run.tail()}")
        nodes = deployment.node_epsilons(args.delta)
    from fedpriv.files import write_json_atomic

    write_json_atomic(out / "nodes.json", nodes)
    results = json.loads((out / "results.json").read_text())
    print(summary(results, nodes, args.target_epsilon, out, budget))
    return {"results": results, "nodes": nodes}


if __name__ == "__main__":
    main()
