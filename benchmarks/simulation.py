"""Per-round cost of Flower's Ray simulation against a plain loop doing the same local work.

``python -m benchmarks.simulation`` simulates 1,000 MNIST clients (60 examples each, IID),
samples 10% per round, and times each round's training phase (sampling, messages, local
DP-SGD, booking, aggregation; not evaluation). The plain loop trains the same number of
clients per round with the same plan through ``fedpriv.training.train_round`` and
averages their models: no Flower, no Ray, no ledgers. Writes JSON, prints the ratio.

It also reports how long the server took to discover the nodes (``discovery_seconds``) and
the peak memory (PSS, ``benchmarks._memory``) of the driver and of Ray's processes during
the simulation. Several ``--clients`` give the growth curve: one point each (each client
holds at most 60 examples, so that MNIST's 60,000 suffice), written as ``{"points": [...]}``,
and ``--plot`` draws it. ``--flower-delivery`` runs Flower's own message delivery loop
instead of ``simulations._delivery``, to measure what that costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulations._cli import (
    Parser,
    add_cache_dir,
    at_least,
    flag_message,
    non_negative,
    probability,
    use_cache_dir,
)
from simulations._logging import quiet_console

if TYPE_CHECKING:
    from fedpriv.federation.settings import RunSettings

# torch, Flower and the apps are imported once the flags are checked: a bad flag is one line at once.

MNIST_TRAIN_EXAMPLES = 60_000

# run-config key -> the flag that sets it, for error messages
FLAGS = {"min-clients": "--clients", "rounds": "--rounds", "fraction-train": "--fraction-train",
         "limit-train": "--examples-per-client", "lot-size": "--lot-size",
         "noise-multiplier": "--noise-multiplier", "model": "--model", "data-dir": "--data-dir"}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m benchmarks.simulation", description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=at_least(1), nargs="+", default=[1000],
                   help="one or more numbers of clients, each a point of the curve (default: 1000)")
    p.add_argument("--examples-per-client", type=at_least(1),
                   help=f"(default: 60, or {MNIST_TRAIN_EXAMPLES:,} / clients where that is less)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="(default: 3)")
    p.add_argument("--fraction-train", type=probability, default=0.1, help="(default: 0.1)")
    p.add_argument("--lot-size", type=at_least(1),
                   help="expected lot size (default: half the examples per client, q = 0.5: 30 of 60)")
    p.add_argument("--noise-multiplier", type=non_negative, default=1.0, help="(default: 1.0)")
    p.add_argument("--model", default="cnn",
                   help="default cnn: trains on pixels, so the ratio is not diluted by feature transforms")
    p.add_argument("--data-dir", help="root folder of MNIST (default: $XDG_CACHE_HOME/fedpriv or ~/.cache/fedpriv)")
    p.add_argument("--out", type=Path, default=Path("runs/benchmark-simulation.json"),
                   help="(default: runs/benchmark-simulation.json)")
    p.add_argument("--plot", type=Path, help="PNG of time per round, discovery and memory against clients")
    p.add_argument("--flower-delivery", action="store_true",
                   help="deliver messages with Flower's own loop (O(nodes × messages) per sweep)")
    add_cache_dir(p)
    return p


@dataclass(frozen=True)
class Point:
    """One simulated federation: its size, each client's examples and expected lot."""

    clients: int
    examples_per_client: int
    lot_size: int
    clients_per_round: int


def points(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Point]:
    """The points the flags ask for; a federation larger than MNIST is one ``parser.error``."""
    found = []
    for clients in args.clients:
        examples = args.examples_per_client or max(1, min(60, MNIST_TRAIN_EXAMPLES // clients))
        if clients * examples > MNIST_TRAIN_EXAMPLES:
            parser.error(f"--clients × --examples-per-client must be <= {MNIST_TRAIN_EXAMPLES} (MNIST's training "
                         f"set), got {clients} × {examples}")
        found.append(Point(clients, examples, args.lot_size or max(1, examples // 2),
                           max(1, int(clients * args.fraction_train))))
    return found


def run_config(point: Point, args: argparse.Namespace, out: str) -> dict[str, Any]:
    """The run-config overrides of ``point``'s simulation (kebab-case)."""
    overrides: dict[str, Any] = {
        "dataset": "mnist", "rounds": args.rounds, "min-clients": point.clients,
        "fraction-train": args.fraction_train, "limit-train": point.clients * point.examples_per_client,
        "limit-test": 1000, "lot-size": point.lot_size, "noise-multiplier": args.noise_multiplier,
        "model": args.model, "out": out,
    }
    if args.data_dir:
        overrides["data-dir"] = str(Path(args.data_dir).resolve())
    return overrides


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       overrides: dict[str, Any]) -> RunSettings:
    """The run's settings and plan as the apps will parse them, and MNIST's files: any
    problem is one ``parser.error`` line, before data is loaded or Ray started."""
    from fedpriv.data import DatasetNotFoundError, check_available
    from fedpriv.federation.settings import RunSettings
    from fedpriv.models import MODELS
    from server.assign import base_plan

    if args.model not in MODELS:
        parser.error(f"argument --model: invalid choice: {args.model!r} (choose from {', '.join(MODELS)})")
    try:
        settings = RunSettings.from_run_config(overrides)
        base_plan(settings)
        check_available(settings.dataset, settings.data_dir)
    except DatasetNotFoundError as err:
        parser.error(str(err))
    except ValueError as err:  # SettingsError, or the plan's own checks
        parser.error(flag_message(str(err), FLAGS))
    return settings


def plain_loop(settings: RunSettings, num_clients: int, per_round: int) -> list[float]:
    """Seconds per round of: train ``per_round`` clients one after another, then average. The
    data set is loaded and split first, as the simulation's nodes do while they are discovered."""
    from clients.task import local_data
    from fedpriv.models import build_model
    from fedpriv.training import default_device, train_round
    from server.assign import base_plan

    plan = base_plan(settings)
    model = build_model(plan.model, settings.seed)
    rng = random.Random(settings.seed)
    data_dir = settings.data_dir  # the loop is its nodes' operator: it reads the data from --data-dir
    key = settings.seed  # its nodes' partition-key, as the simulation sets it (simulated_node_policy)
    local_data(settings, {"partition-id": 0, "num-partitions": num_clients}, data_dir, partition_key=key)
    seconds = []
    for round_ in range(1, settings.rounds + 1):
        start = time.perf_counter()
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        total, weight = None, 0
        for client in sorted(rng.sample(range(num_clients), per_round)):
            node = {"partition-id": client, "num-partitions": num_clients}
            data = local_data(settings, node, data_dir, model=plan.model, partition_key=key)
            model.load_state_dict(global_state)
            report = train_round(model, data.features, data.labels, plan, seed=settings.seed, client=client,
                                 round_=round_, device=default_device())
            state = {k: v.detach().cpu() * report.num_examples for k, v in model.state_dict().items()}
            total = state if total is None else {k: total[k] + state[k] for k in total}
            weight += report.num_examples
        if total is None:  # per_round >= 1 clients were sampled
            raise ValueError("no client trained this round")
        model.load_state_dict({k: v / weight for k, v in total.items()})
        seconds.append(time.perf_counter() - start)
    return seconds


def measure(point: Point, args: argparse.Namespace, settings: RunSettings) -> dict[str, Any]:
    """One point: the plain loop, then the simulation (discovery, rounds, peak memory)."""
    import torch
    from flwr.common.config import get_fused_config_from_dir

    from benchmarks._memory import PeakMemory
    from simulations._federated import PROJECT_ROOT, node_policy_env, simulate, simulated_node_policy

    load_before = os.getloadavg()
    loop = plain_loop(settings, point.clients, point.clients_per_round)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = run_config(point, args, tmp)
        policy = simulated_node_policy(get_fused_config_from_dir(PROJECT_ROOT, overrides), Path(tmp))
        with node_policy_env(policy, Path(tmp), point.clients), PeakMemory() as memory:
            total = simulate(point.clients, overrides, flower_delivery=args.flower_delivery)
        results = json.loads((Path(tmp) / "results.json").read_text())
    sim = [r["train_seconds"] for r in results["rounds"]]
    sim_median, loop_median = statistics.median(sim), statistics.median(loop)
    return {
        "clients": point.clients, "examples_per_client": point.examples_per_client,
        "clients_per_round": point.clients_per_round, "rounds": args.rounds, "model": args.model,
        "lot_size": point.lot_size, "noise_multiplier": args.noise_multiplier,
        "simulation_round_seconds": sim, "plain_loop_round_seconds": loop,
        "simulation_median_s": sim_median, "plain_loop_median_s": loop_median,
        "ratio": sim_median / loop_median,
        "simulation_total_s": total,  # with Ray start, discovery of every node, evaluation
        "torch_threads_plain_loop": torch.get_num_threads(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "discovery_seconds": results["discovery_seconds"],
        "overhead_per_sampled_client_ms": 1000 * (sim_median - loop_median) / point.clients_per_round,
        "memory_peak_mib": memory.peak_mb,
        "flower_delivery": args.flower_delivery,
        "load_average": {"before": load_before[0], "after": os.getloadavg()[0]},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_cache_dir(parser, args.cache_dir)
    todo = points(parser, args)
    # Before torch starts its OpenMP threads: spinning threads made the plain loop 17× slower
    # (412 vs 24 ms per client) beside other busy processes, turning the ratio into a load meter.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    settings = [settings_from_args(parser, args, run_config(point, args, "")) for point in todo]
    quiet_console()  # each log line once (Flower's records reach no root handler); no Ray tip
    measured = []
    for point, point_settings in zip(todo, settings, strict=True):
        measured.append(measure(point, args, point_settings))
        print(f"{point.clients} clients, per round: simulation {measured[-1]['simulation_median_s']:.2f} s, "
              f"plain loop {measured[-1]['plain_loop_median_s']:.2f} s, ratio {measured[-1]['ratio']:.2f}, "
              f"discovery {measured[-1]['discovery_seconds']:.1f} s")
    result = measured[0] if len(measured) == 1 else {"points": measured}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    if args.plot:
        from benchmarks._growth_plot import plot_growth

        plot_growth(measured, args.plot)
    print(f"written to {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return result


if __name__ == "__main__":
    main()
