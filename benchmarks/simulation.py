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
from typing import Any

import torch

from clients.task import local_data
from fedpriv.federation.settings import RunSettings
from fedpriv.models import build_model
from fedpriv.training import default_device, train_round
from server.assign import base_plan
from simulations._federated import PROJECT_ROOT, node_policy_env, simulate, simulated_node_policy


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulation", description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--examples-per-client", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fraction-train", type=float, default=0.1)
    p.add_argument("--lot-size", type=int, default=30, help="expected lot size (q = lot / 60)")
    p.add_argument("--noise-multiplier", type=float, default=1.0)
    p.add_argument("--model", default="cnn",
                   help="default cnn: trains on pixels, so the ratio is not diluted by feature transforms")
    p.add_argument("--data-dir")
    p.add_argument("--out", type=Path, default=Path("runs/benchmark-simulation.json"))
    return p


def plain_loop(settings: RunSettings, num_clients: int, per_round: int) -> list[float]:
    """Seconds per round of: train ``per_round`` clients one after another, then average."""
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
    args = build_parser().parse_args(argv)
    per_round = max(1, int(args.clients * args.fraction_train))
    with tempfile.TemporaryDirectory() as tmp:
        overrides: dict[str, Any] = {
            "dataset": "mnist", "rounds": args.rounds, "min-clients": args.clients, "fraction-train": args.fraction_train,
            "limit-train": args.clients * args.examples_per_client, "limit-test": 1000,
            "lot-size": args.lot_size, "noise-multiplier": args.noise_multiplier, "model": args.model, "out": tmp,
        }
        if args.data_dir:
            overrides["data-dir"] = str(Path(args.data_dir).resolve())
        settings = RunSettings.from_run_config(overrides)
        loop = plain_loop(settings, args.clients, per_round)
        from flwr.common.config import get_fused_config_from_dir

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
