"""Per-round cost of Flower's Ray simulation against a plain loop doing the same local work.

``python -m benchmarks.simulation`` simulates 1,000 MNIST clients (60 examples each, IID),
samples 10% per round, and times each round's training phase (sampling, messages, local
DP-SGD, booking, aggregation; not evaluation). The plain loop trains the same number of
clients per round with the same plan through ``fedpriv.training.train_round`` and
averages their models: no Flower, no Ray, no ledgers. Writes JSON, prints the ratio.
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
    p.add_argument("--clients", type=at_least(1), default=1000, help="(default: 1000)")
    p.add_argument("--examples-per-client", type=at_least(1), default=60, help="(default: 60)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="(default: 3)")
    p.add_argument("--fraction-train", type=probability, default=0.1, help="(default: 0.1)")
    p.add_argument("--lot-size", type=at_least(1), default=30, help="expected lot size (q = lot / 60; default: 30)")
    p.add_argument("--noise-multiplier", type=non_negative, default=1.0, help="(default: 1.0)")
    p.add_argument("--model", default="cnn",
                   help="default cnn: trains on pixels, so the ratio is not diluted by feature transforms")
    p.add_argument("--data-dir", help="root folder of MNIST (default: $XDG_CACHE_HOME/fedpriv or ~/.cache/fedpriv)")
    p.add_argument("--out", type=Path, default=Path("runs/benchmark-simulation.json"),
                   help="(default: runs/benchmark-simulation.json)")
    add_cache_dir(p)
    return p


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
    if args.clients * args.examples_per_client > MNIST_TRAIN_EXAMPLES:
        parser.error(f"--clients × --examples-per-client must be <= {MNIST_TRAIN_EXAMPLES} (MNIST's training "
                     f"set), got {args.clients} × {args.examples_per_client}")
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
    """Seconds per round of: train ``per_round`` clients one after another, then average."""
    from clients.task import local_data
    from fedpriv.models import build_model
    from fedpriv.training import default_device, train_round
    from server.assign import base_plan

    plan = base_plan(settings)
    model = build_model(plan.model, settings.seed)
    rng = random.Random(settings.seed)
    seconds = []
    for round_ in range(1, settings.rounds + 1):
        start = time.perf_counter()
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        total, weight = None, 0
        for client in sorted(rng.sample(range(num_clients), per_round)):
            node = {"partition-id": client, "num-partitions": num_clients}
            data = local_data(settings, node, model=plan.model)
            model.load_state_dict(global_state)
            report = train_round(model, data.features, data.labels, plan, settings.seed, client,
                                 round_, default_device())
            state = {k: v.detach().cpu() * report.num_examples for k, v in model.state_dict().items()}
            total = state if total is None else {k: total[k] + state[k] for k in total}
            weight += report.num_examples
        model.load_state_dict({k: v / weight for k, v in total.items()})
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_cache_dir(parser, args.cache_dir)
    per_round = max(1, int(args.clients * args.fraction_train))
    with tempfile.TemporaryDirectory() as tmp:
        overrides: dict[str, Any] = {
            "dataset": "mnist", "rounds": args.rounds, "min-clients": args.clients, "fraction-train": args.fraction_train,
            "limit-train": args.clients * args.examples_per_client, "limit-test": 1000,
            "lot-size": args.lot_size, "noise-multiplier": args.noise_multiplier, "model": args.model, "out": tmp,
        }
        if args.data_dir:
            overrides["data-dir"] = str(Path(args.data_dir).resolve())
        settings = settings_from_args(parser, args, overrides)
        import torch
        from flwr.common.config import get_fused_config_from_dir

        from simulations._federated import PROJECT_ROOT, node_policy_env, simulate, simulated_node_policy

        quiet_console()  # each log line once (Flower's records reach no root handler); no Ray tip
        loop = plain_loop(settings, args.clients, per_round)
        policy = simulated_node_policy(get_fused_config_from_dir(PROJECT_ROOT, overrides), Path(tmp))
        with node_policy_env(policy, Path(tmp)):
            total = simulate(args.clients, overrides)
        results = json.loads((Path(tmp) / "results.json").read_text())
    sim = [r["train_seconds"] for r in results["rounds"]]
    result = {
        "clients": args.clients, "examples_per_client": args.examples_per_client,
        "clients_per_round": per_round, "rounds": args.rounds, "model": args.model, "lot_size": args.lot_size,
        "noise_multiplier": args.noise_multiplier,
        "simulation_round_seconds": sim, "plain_loop_round_seconds": loop,
        "simulation_median_s": statistics.median(sim), "plain_loop_median_s": statistics.median(loop),
        "ratio": statistics.median(sim) / statistics.median(loop),
        "simulation_total_s": total,  # with Ray start, discovery of 1,000 nodes, evaluation
        "torch_threads_plain_loop": torch.get_num_threads(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"per round: simulation {result['simulation_median_s']:.2f} s, plain loop "
          f"{result['plain_loop_median_s']:.2f} s, ratio {result['ratio']:.2f} (written to {args.out})")
    return result


if __name__ == "__main__":
    main()
