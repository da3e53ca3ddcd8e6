"""The command line shared by ``simulations.mnist`` and ``simulations.cifar``.

Both run the project's own ClientApp and ServerApp (the ``[tool.flwr.app.components]``
of ``pyproject.toml``) through Flower's simulation engine with the Ray backend. The
flags become run-config overrides of ``[tool.flwr.app.config]``, fused exactly as
``flwr run`` fuses them, so the apps see the same ``context.run_config`` either way.
(``flwr.simulation.run_simulation`` leaves ``run_config`` empty; we call the engine's
``_run_simulation`` the way Flower's own ``flwr-simulation`` process does, through
``simulations._flower_private``.)

The command is also the operator of the nodes it simulates, so it sets their privacy
policy (``simulated_node_policy``): budget from the flags, seeded randomness and one
partition key for all its nodes from ``--seed`` (reproducible, which a deployment must not be), N public unless
``--num-examples-noise`` is given (as the centralized baseline assumes), and each node's
durable ledger under ``--state-dir``/nodes/<partition id>, and their data folder from
``--data-dir`` (a node never reads the folder a run config names). It initialises the ledger
of each node never initialised (``fedpriv.node``; the ids recorded beside the nodes' policy
file, ``nodes/policy.toml``): a node whose ledger was lost refuses, never starts again.
Without ``--state-dir`` all state lives in a temporary folder and is gone after the run.

Every input is checked before Ray starts: the flags by their argparse types
(``simulations._cli``, before torch is imported), the fused run config by ``RunSettings``
and the training plan exactly as the apps will parse them (``simulations._run_config``), and the
data set's files (``check_data``). A bad one is a single ``prog: error: ...`` line, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedpriv.dpsgd.memory import GPU_SHARE_ENV
from fedpriv.federation.policy import POLICY_ENV, SecAggTrust, load_policy, policy_file_text
from fedpriv.federation.seeded import warn_seeded
from fedpriv.federation.settings import RunSettings
from fedpriv.files import write_bytes_atomic, write_json_atomic
from fedpriv.node import init_nodes
from fedpriv.project import PROJECT_ROOT
from fedpriv.seeding import SIMULATION_RUN_ID
from server.history import epsilon_summary
from simulations._cli import LOG_FILE, federated_parser, use_cache_dir
from simulations._logging import console
from simulations._ray import ray_cluster
from simulations._run_config import check_settings, fused_run_config


def build_parser(dataset: str) -> argparse.ArgumentParser:
    """The flags of ``python -m simulations.<dataset>`` (``simulations._cli``, which imports
    nothing heavy); unset flags keep pyproject's defaults."""
    return federated_parser(dataset)


def check_data(parser: argparse.ArgumentParser, settings: RunSettings) -> None:
    """The data set is there (or downloaded now, once): one error from the command instead of
    one per simulated client after Ray has started. A user's task is checked whole
    (``fedpriv.task.check_task``: its module, data and model) on every simulated node's share."""
    from fedpriv.data import DatasetNotFoundError, check_available

    if settings.task is not None:
        task_sizes(parser, settings, 1, settings.seed)
        return
    try:
        check_available(settings.dataset, settings.data_dir, settings.download)
    except DatasetNotFoundError as err:
        parser.error(str(err))


def check_delta(parser: argparse.ArgumentParser, settings: RunSettings, num_clients: int,
                partition_key: int) -> list[int]:
    """δ against the smallest simulated node's N (the command is its nodes' operator: it knows
    their shares): δ ≥ 1/N allows publishing a record outright, so it is ``parser.error``;
    δ > 1/(10N) is a warning on stderr. An empty share is an error too. Returns the shares' sizes."""
    from clients.delta import DeltaFit, delta_fit

    try:
        sizes = share_sizes(settings, num_clients, partition_key)
    except ValueError as err:  # a user's task refused on a simulated node's share (fedpriv.task.TaskError)
        parser.error(str(err))
    size, smallest = min((n, p) for p, n in enumerate(sizes))
    if size == 0:
        parser.error(f"argument --clients: simulated node {smallest}'s share of the training set is empty "
                     "(fewer clients, more data or another --partition)")
    fit = delta_fit(settings.delta, size)
    if fit is DeltaFit.TOO_LARGE:
        parser.error(f"argument --delta: {settings.delta:g} is >= 1/N = {1 / size:.3g} for the smallest simulated "
                     f"node (N = {size}): a δ that large allows publishing a record outright; use δ << 1/N")
    if fit is DeltaFit.WEAK:
        print(f"{parser.prog}: warning: --delta {settings.delta:g} is above 1/(10N) = {1 / (10 * size):.3g} for the "
              f"smallest simulated node (N = {size}); δ well below 1/N is the usual choice", file=sys.stderr)
    return sizes


def share_sizes(settings: RunSettings, num_clients: int, partition_key: int) -> list[int]:
    """Each simulated node's number of training records (the command is their operator)."""
    from fedpriv.data import load_dataset
    from fedpriv.federation.partition import Split

    if settings.task is not None:
        return task_sizes(None, settings, num_clients, partition_key)
    data = load_dataset(settings.dataset, settings.data_dir, train=True, limit=settings.limit_train)
    split = Split(data.features, data.labels, settings.partition, num_clients, settings.alpha, partition_key)
    return [len(split.indices(p)) for p in range(num_clients)]


def task_sizes(parser: argparse.ArgumentParser | None, settings: RunSettings, num_clients: int,
               partition_key: int) -> list[int]:
    """Each simulated node's number of training records of the run's task (imported by name:
    the app's folder is on ``sys.path``), every share checked (``check_task``); a broken task
    is ``parser.error``, its one line."""
    from fedpriv.data import default_data_dir
    from fedpriv.task import TaskError, check_task, load_task

    data_dir = Path(settings.data_dir) if settings.data_dir else default_data_dir()
    try:
        assert settings.task is not None  # the caller's branch
        return check_task(load_task(settings.task), data_dir, settings.seed, num_clients, partition_key)
    except TaskError as err:
        if parser is None:
            raise
        parser.error(str(err))


def dry_run(settings: RunSettings, num_clients: int, sizes: Sequence[int]) -> dict[str, Any]:
    """``--dry-run``: the planner's plan of this run (``fedpriv.planning``; N public), printed
    with what its rows mean."""
    from fedpriv.planning import plan, table
    from fedpriv.planning.__main__ import plan_notes
    from simulations._advice import federation

    result = plan(federation(settings, num_clients, sizes))
    print("\n".join([table(result), *plan_notes(result)]))
    return result


def simulated_node_policy(run_config: Mapping[str, Any], state_dir: Path, epsilon_budget: float | None = None,
                          num_examples_noise: float | None = None, clients: int = 1) -> dict[str, Any]:
    """The policy of every simulated node (``fedpriv.federation.policy`` keys); no budget
    means an explicitly unlimited one (the simulation's choice as the nodes' operator). The
    nodes read their data from the command's ``--data-dir`` (the run config's ``data-dir``,
    made absolute: Ray workers' cwd differs), else from their default cache folder, as the
    server does; the keys of the run's privacy mode are ``mode_policy``'s."""
    data_dir = {"data-dir": str(Path(run_config["data-dir"]).resolve())} if run_config.get("data-dir") else {}
    return {
        "epsilon-budget": epsilon_budget or math.inf,
        "delta": float(run_config["delta"]),
        "state-dir": str(state_dir / "nodes" / "{partition-id}"),
        "randomness": "seeded",
        "seed": int(run_config["seed"]),
        "partition-key": int(run_config["seed"]),  # one key for all its nodes: reproducible shares
        "public-num-examples": num_examples_noise is None,
        "num-examples-noise": num_examples_noise or 20.0,
        "allow-evaluate": float(run_config["fraction-evaluate"]) > 0,
        **mode_policy(run_config, clients),
        **data_dir,
    }


def mode_policy(run_config: Mapping[str, Any], clients: int) -> dict[str, Any]:
    """The policy keys with which the operator of ``clients`` nodes (the simulations', the
    deployment's) lets them take part in the run's privacy mode. In a distributed run every
    node aggregates only with all ``clients`` nodes (min-cohort), tolerating no dropout or
    collusion: its share is 1/K of the noise; with ``secagg-neighbours`` k, it accepts
    SecAgg+'s sparse graph of k neighbours (no fewer). In a distributed user-level run its
    min-cohort is half the expected cohort (rounded up): a Poisson cohort below it is refused,
    and each share is sized for that many. In a central user-level run it trusts the server
    to add the noise (``allow-central-user``): the operator runs, or vouches for, that server."""
    neighbours = int(run_config.get("secagg-neighbours", 0))
    user = run_config.get("privacy") == "user"
    distributed = {"allow-distributed": True, "min-cohort": clients} if run_config.get("privacy") == "distributed" \
        else {}
    if user and run_config.get("user-noise") == "distributed":
        distributed = {"allow-distributed": True, "min-cohort": math.ceil((run_config.get("cohort") or clients) / 2)}
    if distributed and neighbours:
        distributed["min-secagg-neighbours"] = neighbours
    return {**distributed, "allow-central-user": user and run_config.get("user-noise") != "distributed"}


def consortium_policy(folder: Path, partitions: Iterable[int]) -> dict[str, str]:
    """The policy keys by which nodes count only peers of one consortium (``secagg-ca``,
    ``secagg-identity``, ``{partition-id}`` expanded): its CA made in ``folder`` once, and an
    identity for each of ``partitions`` that has none (``fedpriv.certificates.write_consortium``)."""
    from fedpriv.certificates import write_consortium

    ca = write_consortium(folder, [str(p) for p in partitions])
    return {"secagg-ca": str(ca), "secagg-identity": str(folder / "{partition-id}")}


def secagg_trust(policy_file: Path) -> str:
    """The trust model the nodes of ``policy_file`` book distributed rounds under (partition 0's)."""
    return str(load_policy({"policy": str(policy_file), "partition-id": 0}, environ={}).secagg_trust)


@contextlib.contextmanager
def node_policy_env(policy: Mapping[str, Any], state_dir: Path, clients: int) -> Iterator[Path]:
    """Write the simulated nodes' policy file, initialise the ledgers of the ``clients`` nodes
    never initialised, and point ``FEDPRIV_NODE_POLICY`` at the file for the simulation's
    processes (Ray workers inherit the environment)."""
    path = state_dir / "nodes" / "policy.toml"
    if policy.get("allow-distributed"):  # the operator's consortium: every node's peers certified
        policy = {**policy, **consortium_policy(state_dir / "nodes" / "consortium", range(clients))}
    write_bytes_atomic(path, policy_file_text(policy).encode())
    init_nodes(path, range(clients))  # a node whose ledger was lost stays refusing
    saved = os.environ.get(POLICY_ENV)
    os.environ[POLICY_ENV] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop(POLICY_ENV, None)
        else:
            os.environ[POLICY_ENV] = saved


def backend_config(args: argparse.Namespace, settings: RunSettings) -> dict[str, Any]:
    """Ray resources: the cores shared out (one per client once there are at least as many
    clients as torch threads), and with CUDA the share of a GPU one client's measured step
    needs (``simulations._gpu``). Ray sets each client's OMP_NUM_THREADS to its CPUs, so a
    single client trains with the thread count of ``simulations.centralized`` — and float
    results depend on the thread count."""
    cpus = args.cpus_per_client or max(1, torch.get_num_threads() // args.clients)
    gpus = args.gpus_per_client
    if gpus is None and torch.cuda.is_available() and settings.task is None:  # a task's step is measured on its node
        from simulations._gpu import client_gpu_fraction

        gpus = client_gpu_fraction(settings, args.clients, torch.cuda.get_device_properties(0).total_memory)
    init_args: dict[str, Any] = {"address": args.ray_address} if args.ray_address else {}
    return {
        "client_resources": {"num_cpus": cpus, "num_gpus": gpus or 0.0},
        "init_args": init_args,
    }


def simulate(
    num_clients: int, overrides: dict[str, Any], backend: dict[str, Any] | None = None,
    flower_delivery: bool = False, app_dir: Path = PROJECT_ROOT,
) -> float:
    """Run the apps on ``num_clients`` simulated SuperNodes; returns wall seconds. Messages
    reach the actors through ``simulations._delivery`` unless ``flower_delivery`` (Flower's
    own loop, O(nodes × messages) per sweep: for measuring it). ``app_dir``: the app whose
    pyproject.toml names the apps and the run config (a user's app: ``simulations.run``)."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir, get_project_config
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run

    from simulations._delivery import one_pass_delivery
    from simulations._flower_private import run_simulation, set_task_identity

    components = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]
    # What _run_simulation does for a run it creates itself, plus our overrides.
    run = Run.create_empty(run_id=SIMULATION_RUN_ID)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    run.override_config = dict(overrides)
    set_task_identity(run_id=run.run_id, task_id=1, node_id=SUPERLINK_NODE_ID)
    run_config = get_fused_config_from_dir(app_dir, run.override_config)
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    backend = backend or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {}}
    env = {POLICY_ENV: os.environ[POLICY_ENV]} if POLICY_ENV in os.environ else {}
    if backend["client_resources"].get("num_gpus"):  # each client plans its memory within its share
        env[GPU_SHARE_ENV] = str(min(1.0, backend["client_resources"]["num_gpus"]))
    start = time.perf_counter()
    delivery = contextlib.nullcontext() if flower_delivery else one_pass_delivery()
    with ray_cluster(backend.get("init_args", {}), env), delivery:  # bounded start; Flower uses it
        run_simulation(
            run,
            num_supernodes=num_clients,
            server_app_attr=components["serverapp"],
            client_app_attr=components["clientapp"],
            backend_name="ray",
            backend_config=backend,
            server_app_context=context,
            app_dir=str(app_dir),
        )
    return time.perf_counter() - start


def main(dataset: str | None, argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
         app_dir: Path = PROJECT_ROOT) -> dict[str, Any]:
    """Parse flags, simulate, add the total wall time to results.json, plot it. A run that
    could train nothing (every budget in ``--state-dir`` spent) stops before Ray starts.
    ``dataset`` None: the user's app in ``app_dir`` (``simulations.run``, with its ``parser``)."""
    parser = parser or build_parser(str(dataset))
    args = parser.parse_args(argv)
    use_cache_dir(parser, args.cache_dir)
    overrides, run_config = fused_run_config(parser, args, dataset, app_dir)
    settings = check_settings(parser, run_config)
    check_data(parser, settings)
    sizes = check_delta(parser, settings, args.clients, settings.seed)  # simulated_node_policy's partition-key
    if args.dry_run:
        return dry_run(settings, args.clients, sizes)
    from simulations._advice import before_training

    budget = args.client_epsilon_budget or args.epsilon_budget or args.target_epsilon
    try:
        advice = before_training(settings, args.clients, sizes, budget)
    except ValueError as err:
        parser.error(str(err))
    for line in advice:
        print(f"{parser.prog}: {line}", file=sys.stderr, flush=True)
    out = Path(overrides["out"])  # checked by simulations._command, before anything heavy
    with contextlib.ExitStack() as stack:
        state_dir = Path(args.state_dir).resolve() if args.state_dir else \
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fedpriv-state-")))
        policy = simulated_node_policy(run_config, state_dir, budget, args.num_examples_noise, args.clients)
        policy_file = stack.enter_context(node_policy_env(policy, state_dir, args.clients))
        trust = secagg_trust(policy_file) if policy.get("allow-distributed") else None
        from simulations._spent import nothing_to_spend

        if reason := nothing_to_spend(settings, state_dir, args.clients):
            parser.exit(1, f"{parser.prog}: {reason}\n")
        warn_seeded()  # this process's one warning, once it will run; each node process prints its own
        stack.enter_context(console(out / LOG_FILE))  # Flower's and Ray's notices in the log, not the terminal
        wall = simulate(args.clients, overrides, backend_config(args, settings), app_dir=app_dir)
        from simulations._spent import node_epsilon

        node_spent = node_epsilon(state_dir, args.clients, settings.delta)
    results_path = out / "results.json"
    if not results_path.exists():
        raise SystemExit(f"the ServerApp wrote no {results_path}: see the log above and {out / LOG_FILE}")
    results = json.loads(results_path.read_text())
    results["simulation_wall_time_s"] = wall
    results["randomness"] = policy["randomness"]  # the nodes': the server cannot know it
    results["privacy"] = settings.privacy.value
    if trust is not None:  # whom each node counted toward its cohort
        results["secagg_trust"] = trust
    results["node_epsilon"] = node_spent  # by each node's own ledger: the guarantee
    write_json_atomic(results_path, results)
    from simulations._plots import plot_results

    plot_results(results, out)
    print(summary(results, out))
    if not results["rounds"]:
        raise SystemExit(1)  # nothing trained: not a result
    return results


def summary(results: dict[str, Any], out: Path) -> str:
    """What a run did, in a few lines: rounds, model, the test accuracy of the trained model
    (none without a round: the initial model is no result), each client's ε and its target,
    times, and every file in ``out``."""
    rounds = results["rounds"]
    resolved = results.get("resolved") or {}
    accuracy = results.get("final_accuracy")
    target = results["settings"].get("target_epsilon")
    files = sorted(path.name for path in out.iterdir() if path.is_file())
    lines = [
        f"rounds run: {len(rounds)}" + (f" (stopped: {results['stopped']})" if results["stopped"] else ""),
        f"model: {resolved.get('model')}",
        "test accuracy: " + ("none, no round was trained" if accuracy is None else f"{100 * accuracy:.2f} %"),
        f"ε per client ({resolved.get('accountant')}, δ = {resolved.get('delta')}"
        + ("" if target is None else f", target {target:g}") + f"): "
        f"{epsilon_summary(results['final_epsilon'].values(), results['randomness'])}",
        *([f"distributed rounds booked by every node under: {SecAggTrust(results['secagg_trust']).described}"]
          if results.get("secagg_trust") else []),
        f"server wall time: {results['wall_time_s']:.1f} s, total {results['simulation_wall_time_s']:.1f} s",
        f"model_sha256: {results['model_sha256']}",
        f"written to {out}: {', '.join(files)}",
    ]
    return "\n".join(lines)
