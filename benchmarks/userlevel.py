"""fedpriv's central user-level DP-FedAvg beside Flower's ``DifferentialPrivacyServerSideFixedClipping``
around ``FedAvg``: the same MNIST federation, local training, clip S, noise multiplier z,
rounds and seed (``docs/user-level.md``).

``python -m benchmarks.userlevel --out F.json`` (1,000 clients of about 60 examples, cohort
100); ``--quick``: 100 clients, cohort 10, 3 rounds. Both run in this process over an
in-process grid (``tests.flower.inprocess.InProcessGrid``: each message handed to a
ClientApp, no Ray) so that only the strategies differ:

- fedpriv: ``server.run.run_server`` with ``privacy = "user"`` and the real ClientApp (each
  node's policy and ledger, Poisson cohorts of expected size k, noise zS on the sum / k);
- Flower: its wrapper around ``FedAvg`` (a fixed cohort of k, the server clips each update to
  S and adds noise zS/k to the mean), with a ClientApp training the same way
  (``fedpriv.training.train_round`` with the plain plan, the node's same share).

Writes the test accuracy per round of each, the L2 distance of their final models,
fedpriv's per-client user-level ε from its population ledger, and the times. Flower's
wrapper keeps no ledger (its optional accountant gives one global ε, no amplification by
sampling).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from simulations._cli import Parser, at_least, positive, write_out


def build_parser() -> Parser:
    p = Parser(prog="python -m benchmarks.userlevel", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100 clients, cohort 10, 3 rounds")
    p.add_argument("--clients", type=at_least(2), default=1000)
    p.add_argument("--per-client", type=at_least(1), default=60, help="expected examples per client (default 60)")
    p.add_argument("--cohort", type=at_least(1), default=100)
    p.add_argument("--rounds", type=at_least(1), default=20)
    p.add_argument("--noise-multiplier", type=positive, default=1.0, help="z (default 1.0)")
    p.add_argument("--user-clip", type=positive, default=0.5, help="S (default 0.5)")
    p.add_argument("--model", default="cnn")
    p.add_argument("--lr", type=positive, default=0.1)
    p.add_argument("--lot-size", type=at_least(1), default=10)
    p.add_argument("--local-epochs", type=at_least(1), default=1)
    p.add_argument("--limit-test", type=at_least(1), default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=at_least(1), default=1,
                   help="torch's intra-op threads (default 1: the small steps of 100s of clients gain nothing "
                        "from more, and on a loaded machine each extra thread waits for a core)")
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--same-draws", action="store_true",
                   help="Flower replays fedpriv's cohorts, noise draws and local-training seeds: the two then "
                        "differ only in the divisor (the actual cohort against the expected one)")
    p.add_argument("--out", type=Path)
    return p


def _run_config(args: Any, state: Path) -> dict[str, Any]:
    return {"rounds": args.rounds, "min-clients": args.clients, "limit-train": args.clients * args.per_client,
            "limit-test": args.limit_test, "model": args.model, "data-dir": args.data_dir, "privacy": "user",
            "cohort": args.cohort, "user-clip": args.user_clip, "noise-multiplier": args.noise_multiplier,
            "server-randomness": "seeded", "seed": args.seed, "lot-size": args.lot_size, "lr": args.lr,
            "local-epochs": args.local_epochs, "state-dir": str(state / "server")}


def _nodes(args: Any, state: Path) -> dict[int, dict[str, Any]]:
    from tests.flower.inprocess import node_config

    policy = {"epsilon-budget": float("inf"), "public-num-examples": True, "allow-central-user": True,
              "data-dir": args.data_dir, "randomness": "seeded", "seed": args.seed, "partition-key": args.seed}
    return {i + 1: node_config(i, args.clients, state, **policy) for i in range(args.clients)}


def _flower_client_app(same_seeds: bool = False) -> Any:
    """A ClientApp training as fedpriv's does (plain plan, same share) and replying the model;
    ``same_seeds``: with the seeds fedpriv's node draws its lots from (its policy's seed, the
    run id and how many rounds it trained before), else the run's seed."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from clients.task import local_data, received_model, training_seed
    from fedpriv.federation.policy import load_policy
    from fedpriv.federation.settings import RunSettings
    from fedpriv.training import default_device, train_round
    from server.assign import base_plan
    from server.userlevel import training_settings

    app = ClientApp()
    trained: dict[str, int] = {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        settings = RunSettings.from_run_config(context.run_config)
        policy = load_policy(context.node_config, environ={})
        plan = base_plan(training_settings(settings))
        data = local_data(settings, context.node_config, policy.data_dir, model=plan.model,
                          partition_key=policy.partition_key)
        model = received_model(msg, plan.model, settings)
        server_round = msg.content.config_records["config"].get("server-round", 1)
        assert isinstance(server_round, int)
        cid = str(context.node_config["partition-id"])
        seed = training_seed(policy, context.run_id, trained.get(cid, 0)) if same_seeds else settings.seed
        trained[cid] = trained.get(cid, 0) + 1
        train_round(model, data.features, data.labels, plan, seed=seed, client=int(cid), round_=server_round,
                    device=default_device())
        content = RecordDict({"arrays": ArrayRecord(model.cpu().state_dict()),
                              "metrics": MetricRecord({"num-examples": 1})})  # uniform weights: the DP mean
        return Message(content, reply_to=msg)

    return app


@contextlib.contextmanager
def _replayed(args: Any, cohorts: list[list[int]]) -> Iterator[None]:
    """Flower's FedAvg samples ``cohorts[r - 1]`` (node ids) in round r, and its wrapper's noise is
    fedpriv's seeded N(0, 1) stream of that round (``fedpriv.federation.userlevel_steps.RoundNoise``: the population's
    uniforms, then each array's normals), scaled by Flower's std zS/k."""
    from unittest import mock

    import numpy as np
    from flwr.serverapp.strategy import dp_fixed_clipping, fedavg

    from fedpriv.seeding import derive_seed

    current = {"round": 0}

    def sample_nodes(grid: Any, min_available_nodes: int, sample_size: int) -> tuple[list[int], list[int]]:
        current["round"] += 1
        return cohorts[current["round"] - 1], list(grid.get_node_ids())

    def add_noise(arrays: list[Any], std: float) -> None:
        rng = np.random.default_rng(derive_seed(args.seed, "user-level", current["round"]))
        rng.random(args.clients)
        for array in arrays:
            array += (rng.standard_normal(array.size) * std).reshape(array.shape).astype(array.dtype)

    with mock.patch.object(fedavg, "sample_nodes", sample_nodes), \
            mock.patch.object(dp_fixed_clipping, "add_gaussian_noise_inplace", add_noise):
        yield


def _evaluate(args: Any) -> Any:
    from fedpriv.data import load_dataset
    from fedpriv.models import build_model, model_inputs
    from fedpriv.training import evaluate

    test = load_dataset("mnist", args.data_dir, train=False, limit=args.limit_test)
    inputs = model_inputs(args.model, test.features)
    model = build_model(args.model, args.seed)

    def evaluate_fn(server_round: int, arrays: Any) -> Any:
        from flwr.app import MetricRecord

        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, inputs, test.labels)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_fn


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` inside, the caller's count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run(args: Any) -> dict[str, Any]:
    """Both runs on ``--threads`` torch threads."""
    with torch_threads(args.threads):
        return _compare(args)


def _compare(args: Any) -> dict[str, Any]:
    """Both runs; their accuracies, final models' distance, times and fedpriv's ε."""
    import numpy as np
    from flwr.app import ArrayRecord
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from fedpriv.models import build_model
    from server.run import run_server
    from server.state import ServerState
    from simulations._flower_private import task_identity
    from tests.flower.inprocess import InProcessGrid

    out: dict[str, Any] = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="fedpriv-userlevel-") as tmp, task_identity(1, 1, 0):
        state = Path(tmp)
        config, nodes = _run_config(args, state), _nodes(args, state)
        start = time.perf_counter()
        history = run_server(cast(Grid, InProcessGrid(config, nodes)), config)
        epsilon = list(history.final_epsilon().values())
        out["fedpriv"] = {"accuracy": [r.test_accuracy for r in history.rounds], "seconds": time.perf_counter() - start,
                          "epsilon": {"min": min(epsilon), "median": statistics.median(epsilon), "max": max(epsilon),
                                      "clients": len(epsilon)},
                          "cohort_sizes": [len(r.participants) for r in history.rounds]}
        random.seed(args.seed)  # Flower samples with `random` and draws its noise with numpy's global generator
        np.random.seed(args.seed)
        fedavg = FedAvg(fraction_train=args.cohort / args.clients, fraction_evaluate=0.0,
                        min_train_nodes=args.cohort, min_available_nodes=args.clients)
        strategy = DifferentialPrivacyServerSideFixedClipping(fedavg, args.noise_multiplier, args.user_clip,
                                                              args.cohort)
        cohorts = [[int(c) + 1 for c in r.participants] for r in history.rounds]  # node id = partition id + 1
        start = time.perf_counter()
        with _replayed(args, cohorts) if args.same_draws else contextlib.nullcontext():
            result = strategy.start(
                cast(Grid, InProcessGrid(config, nodes, client_app=_flower_client_app(args.same_draws))),
                ArrayRecord(build_model(args.model, args.seed).state_dict()), num_rounds=args.rounds,
                evaluate_fn=_evaluate(args))
        out["flower"] = {"accuracy": [cast(float, result.evaluate_metrics_serverapp[r]["accuracy"])
                                      for r in range(1, args.rounds + 1)],
                         "seconds": time.perf_counter() - start, "epsilon": None}
        _, final = ServerState(state / "server").load()
        out["model_distance"] = math.sqrt(sum(  # ‖fedpriv's final model − Flower's‖₂
            float(np.sum((final[k].numpy().astype(np.float64) - a.numpy().astype(np.float64)) ** 2))
            for k, a in result.arrays.items()))
    out["accuracy_gap_points"] = 100 * (out["fedpriv"]["accuracy"][-1] - out["flower"]["accuracy"][-1])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parsed(build_parser(), argv)
    return emit(run(args), args.out)


def parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The flags, ``--quick`` applied and the cohort checked against the clients."""
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.cohort, args.rounds = 100, 10, 3
    if args.cohort > args.clients:
        parser.error(f"argument --cohort: {args.cohort} exceeds --clients {args.clients}")
    return args


def emit(result: dict[str, Any], out: Any) -> dict[str, Any]:
    """``result`` as JSON, printed and written to ``out`` (``--out``)."""
    text = json.dumps(result, indent=2)
    write_out(out, text)
    print(text)
    return result


if __name__ == "__main__":
    main()
