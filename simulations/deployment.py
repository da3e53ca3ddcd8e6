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

This module is the command (its flags, checks and summary); the processes are
``simulations._orchestrator``'s, the namespaces ``simulations._netns``'.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fedpriv.federation.settings import KEYS
from fedpriv.project import PROJECT_ROOT
from simulations._cli import USER_LEVEL_FLAGS, Parser, add_flag, add_user_level, at_least, positive
from simulations._netns import NamespaceNetwork, Network, check_netns

DEPLOYMENT_DEFAULTS = {"limit-test": 1000, "round-timeout": 600.0}
"""The deployment's own defaults for run-config keys (a quick run on one machine)."""
SHARED_FLAGS = {"delta": None, "limit-train": None, "limit-test": "1000", "data-dir": "the cache", "download": None,
                "seed": None, "round-timeout": "600", "secagg-neighbours": None, "resume": None}
"""The run-config keys that are the deployment's flags as ``fedpriv.federation.settings``
defines them (with the default shown where the deployment's own differs)."""
DEFAULTS = {name: KEYS[name].default for name in SHARED_FLAGS} | DEPLOYMENT_DEFAULTS


def build_parser() -> Parser:
    p = Parser(prog="python -m simulations.deployment", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=at_least(1), required=True, help="SuperNodes to start")
    p.add_argument("--rounds", type=at_least(1), required=True, help="federated rounds")
    p.add_argument("--min-clients", type=at_least(1), help="nodes the server waits for (default: --nodes)")
    noise = p.add_mutually_exclusive_group()
    add_flag(noise, KEYS["target-epsilon"], "1, unless --noise-multiplier")
    add_flag(noise, KEYS["noise-multiplier"])
    p.add_argument("--node-epsilon-budget", type=positive,
                   help="record-level ε budget in each node's own policy (default: --target-epsilon; needed with "
                        "--noise-multiplier and with --privacy user, where a node's ledger books z/2 per round it "
                        "takes part in, not the clients' user-level ε)")
    for name, shown in SHARED_FLAGS.items():
        add_flag(p, KEYS[name], shown)
    p.set_defaults(**{name.replace("-", "_"): value for name, value in DEFAULTS.items()})
    p.add_argument("--privacy", choices=["local", "distributed", "user"], default="local",
                   help="local: each node noises its update; distributed: integer noise shares under secure "
                        "aggregation, every node's policy allowing it with min-cohort = --nodes; user: user-level "
                        "DP-FedAvg (docs/user-level.md) with --user-noise central, where every node's operator opts "
                        "in to trusting the server with the noise (allow-central-user = true: its clipped delta "
                        "leaves un-noised), or distributed, every node's policy allowing integer noise shares under "
                        "secure aggregation with min-cohort = ⌈cohort / 2⌉ (default: local)")
    add_user_level(p)
    p.add_argument("--netns", action="store_true", help="each SuperNode in its own network namespace")
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


def check_trained(results: Mapping[str, Any], out: Path) -> None:
    """``SystemExit`` (one line, exit 1) where the run trained no round (every node refused,
    failed or had spent its budget: the initial model is no result), after the summary."""
    if not results.get("rounds"):
        why = results.get("stopped") or "no round"
        raise SystemExit(f"python -m simulations.deployment: nothing was trained ({why}); the run's log says why: "
                         f"{out / 'run.log'}")


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


def check_describable(parser: Parser, budget: float, delta_: float) -> None:
    """Before round 1 each node describes itself with a DP count of its examples, booked in
    its ledger: where that count alone exceeds its budget, every node refuses and nothing
    trains; one ``parser.error`` line instead, before anything starts."""
    from fedpriv.federation.policy import NodePolicy
    from fedpriv.privacy import epsilon_of

    policy = NodePolicy(epsilon_budget=budget, state_dir=Path("unused"), delta=delta_)  # as ``node_policy`` writes
    cost = epsilon_of(policy.num_examples_event(), delta_, policy.accountant)
    if cost > budget:
        parser.error(f"argument --node-epsilon-budget: {budget:g} is below what a node spends to describe itself "
                     f"before round 1 (its DP count of examples, num-examples-noise {policy.num_examples_noise:g}: "
                     f"ε = {cost:.4g} at δ = {delta_:g}): every node would refuse and nothing would train")


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
    check_describable(parser, budget, args.delta)
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
    from simulations._orchestrator import Deployment, freeze_app

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
    check_trained(results, out)
    return {"results": results, "nodes": nodes}


if __name__ == "__main__":
    main()
