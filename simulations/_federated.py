"""The command line shared by ``simulations.mnist`` and ``simulations.cifar``.

Both run the project's own ClientApp and ServerApp (the ``[tool.flwr.app.components]``
of ``pyproject.toml``) through Flower's simulation engine with the Ray backend. The
flags become run-config overrides of ``[tool.flwr.app.config]``, fused exactly as
``flwr run`` fuses them, so the apps see the same ``context.run_config`` either way.
(``flwr.simulation.run_simulation`` leaves ``run_config`` empty; we call the engine's
``_run_simulation`` the way Flower's own ``flwr-simulation`` process does.)

The command is also the operator of the nodes it simulates, so it sets their privacy
policy (``simulated_node_policy``): budget from the flags, seeded randomness from
``--seed`` (reproducible, which a deployment must not be), N public unless
``--num-examples-noise`` is given (as the centralized baseline assumes), and each node's
durable ledger under ``--state-dir``/nodes/<partition id>. Without ``--state-dir`` all
state lives in a temporary folder and is gone after the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from fedpriv.federation.policy import POLICY_ENV
from fedpriv.files import write_bytes_atomic, write_json_atomic
from fedpriv.seeding import SIMULATION_RUN_ID
from server.history import epsilon_summary

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# flag -> run-config key, for the flags that map one to one
_KEYS = (
    "rounds", "local-epochs", "target-epsilon", "delta", "partition", "alpha", "seed",
    "limit-train", "limit-test", "data-dir", "out", "noise-multiplier", "lot-size",
    "max-grad-norm", "lr", "lr-schedule", "model", "fraction-train", "fraction-evaluate", "epsilon-budget",
    "client-epsilon-budget", "download", "state-dir", "resume",
)


def build_parser(dataset: str) -> argparse.ArgumentParser:
    """The flags of ``python -m simulations.<dataset>``; unset flags keep pyproject's defaults."""
    p = argparse.ArgumentParser(
        prog=f"python -m simulations.{'cifar' if dataset == 'cifar10' else dataset}",
        description=f"Federated DP-SGD on {dataset} with Flower's Ray simulation engine.",
    )
    p.add_argument("--clients", type=int, default=10, help="simulated SuperNodes (default 10)")
    p.add_argument("--rounds", type=int)
    p.add_argument("--local-epochs", type=int)
    p.add_argument("--target-epsilon", type=float, help="calibrate each client's σ to end at ≤ ε")
    p.add_argument("--delta", type=float)
    p.add_argument("--epsilon-budget", type=float, help="per-client ε budget of the server ledger")
    p.add_argument("--client-epsilon-budget", type=float,
                   help="ε budget in each simulated node's policy (default: --epsilon-budget, else "
                        "--target-epsilon, else unlimited)")
    p.add_argument("--num-examples-noise", type=float,
                   help="nodes release N as a Gaussian count of this std (default: N is public)")
    p.add_argument("--noise-multiplier", type=float, help="fixed σ for every client")
    p.add_argument("--lot-size", type=int, help="expected Poisson lot size")
    p.add_argument("--max-grad-norm", type=float)
    p.add_argument("--lr", type=float)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], help="default: the data set's plan")
    p.add_argument("--model", help="default: the data set's plan")
    p.add_argument("--fraction-train", type=float, help="fraction of clients sampled per round")
    p.add_argument("--fraction-evaluate", type=float,
                   help="fraction of clients asked for a noisy, booked evaluation per round (default 0)")
    p.add_argument("--partition", choices=["iid", "dirichlet", "shard"])
    p.add_argument("--alpha", type=float, help="Dirichlet concentration")
    p.add_argument("--seed", type=int)
    p.add_argument("--limit-train", type=int, help="use the first N training examples")
    p.add_argument("--limit-test", type=int, help="use the first N test examples")
    p.add_argument("--data-dir")
    p.add_argument("--download", action="store_true", default=None)
    p.add_argument("--out", default=f"runs/{dataset}", help="output folder")
    p.add_argument("--state-dir", help="keep the server's ledger and checkpoints here and each node's "
                                       "ledger under nodes/ (default: a temporary folder)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue the run in --state-dir from its last completed round")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    p.add_argument("--cpus-per-client", type=float,
                   help="default: torch's threads shared out, max(1, threads // clients)")
    p.add_argument("--gpus-per-client", type=float, help="default 0.25 when CUDA is available")
    return p


def run_config_overrides(args: argparse.Namespace, dataset: str) -> dict[str, Any]:
    """The run-config keys the user set (kebab-case), the data set and ``min-clients``."""
    overrides: dict[str, Any] = {"dataset": dataset, "min-clients": args.clients}
    for key in _KEYS:
        value = getattr(args, key.replace("-", "_"))
        if value is not None:
            overrides[key] = str(Path(value).resolve()) if key in ("out", "data-dir", "state-dir") else value
    return overrides


def simulated_node_policy(run_config: Mapping[str, Any], state_dir: Path, epsilon_budget: float | None = None,
                          num_examples_noise: float | None = None) -> dict[str, Any]:
    """The policy of every simulated node (``fedpriv.federation.policy`` keys); no budget
    means an explicitly unlimited one (the simulation's choice as the nodes' operator)."""
    return {
        "epsilon-budget": epsilon_budget or math.inf,
        "delta": float(run_config["delta"]),
        "state-dir": str(state_dir / "nodes" / "{partition-id}"),
        "randomness": "seeded",
        "seed": int(run_config["seed"]),
        "public-num-examples": num_examples_noise is None,
        "num-examples-noise": num_examples_noise or 20.0,
        "allow-evaluate": float(run_config["fraction-evaluate"]) > 0,
    }


def _toml(values: Mapping[str, Any]) -> str:
    """A flat TOML table (str, bool, int, float incl. inf)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isinf(v):
            return "inf"
        return json.dumps(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in values.items())


@contextlib.contextmanager
def node_policy_env(policy: Mapping[str, Any], state_dir: Path) -> Iterator[Path]:
    """Write the simulated nodes' policy file and point ``FEDPRIV_NODE_POLICY`` at it for
    the simulation's processes (Ray workers inherit the environment)."""
    path = state_dir / "nodes" / "policy.toml"
    write_bytes_atomic(path, _toml(policy).encode())
    saved = os.environ.get(POLICY_ENV)
    os.environ[POLICY_ENV] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop(POLICY_ENV, None)
        else:
            os.environ[POLICY_ENV] = saved


def backend_config(args: argparse.Namespace) -> dict[str, Any]:
    """Ray resources: the cores shared out (one per client once there are at least as many
    clients as torch threads), a GPU fraction when CUDA is there. Ray sets each client's
    OMP_NUM_THREADS to its CPUs, so a single client trains with the thread count of
    ``simulations.centralized`` — and float results depend on the thread count."""
    cpus = args.cpus_per_client or max(1, torch.get_num_threads() // args.clients)
    gpus = args.gpus_per_client
    if gpus is None:
        gpus = 0.25 if torch.cuda.is_available() else 0.0
    init_args: dict[str, Any] = {"address": args.ray_address} if args.ray_address else {}
    return {
        "client_resources": {"num_cpus": cpus, "num_gpus": gpus},
        "init_args": init_args,
    }


def simulate(
    num_clients: int, overrides: dict[str, Any], backend: dict[str, Any] | None = None
) -> float:
    """Run the apps on ``num_clients`` simulated SuperNodes; returns wall seconds."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir, get_project_config
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    components = get_project_config(PROJECT_ROOT)["tool"]["flwr"]["app"]["components"]
    # What _run_simulation does for a run it creates itself, plus our overrides.
    run = Run.create_empty(run_id=SIMULATION_RUN_ID)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    run.override_config = dict(overrides)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    run_config = get_fused_config_from_dir(PROJECT_ROOT, run.override_config)
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    start = time.perf_counter()
    _run_simulation(
        num_supernodes=num_clients,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        server_app_attr=components["serverapp"],
        client_app_attr=components["clientapp"],
        backend_name="ray",
        backend_config=backend or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        server_app_context=context,
        app_dir=str(PROJECT_ROOT),
        run=run,
        is_app=True,
    )
    return time.perf_counter() - start


def main(dataset: str, argv: list[str] | None = None) -> dict[str, Any]:
    """Parse flags, simulate, add the total wall time to results.json, plot it."""
    # Flower logs through its own handler; once a dependency gives the root logger one
    # (a module-level ``logging.warning``), every line would print twice.
    logging.getLogger("flwr").propagate = False
    args = build_parser(dataset).parse_args(argv)
    overrides = run_config_overrides(args, dataset)
    from flwr.common.config import get_fused_config_from_dir

    run_config = get_fused_config_from_dir(PROJECT_ROOT, overrides)
    with contextlib.ExitStack() as stack:
        state_dir = Path(args.state_dir).resolve() if args.state_dir else \
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fedpriv-state-")))
        budget = args.client_epsilon_budget or args.epsilon_budget or args.target_epsilon
        policy = simulated_node_policy(run_config, state_dir, budget, args.num_examples_noise)
        stack.enter_context(node_policy_env(policy, state_dir))
        wall = simulate(args.clients, overrides, backend_config(args))
    out = Path(overrides["out"])
    results_path = out / "results.json"
    if not results_path.exists():
        raise SystemExit(f"the ServerApp wrote no {results_path}: see the log above")
    results = json.loads(results_path.read_text())
    results["simulation_wall_time_s"] = wall
    write_json_atomic(results_path, results)
    from simulations._plots import plot_results

    plot_results(results, out)
    print(_summary(results))
    return results


def _summary(results: dict[str, Any]) -> str:
    rounds = results["rounds"]
    last = rounds[-1] if rounds else {}
    lines = [
        f"rounds run: {len(rounds)}" + (f" (stopped: {results['stopped']})" if results["stopped"] else ""),
        f"test accuracy: {last.get('test_accuracy')}",
        f"ε per client: {epsilon_summary(results['final_epsilon'].values())}",
        f"server wall time: {results['wall_time_s']:.1f} s, total {results['simulation_wall_time_s']:.1f} s",
        f"model_sha256: {results['model_sha256']}",
    ]
    return "\n".join(lines)
