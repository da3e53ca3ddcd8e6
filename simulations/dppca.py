"""DP-PCA + MLP on MNIST (Abadi et al. 2016): ``python -m simulations.dppca --epsilon 2 --out dppca.json``.

A noisy second-moment matrix of the unit-norm training images (``fedpriv.algorithms.dppca``)
gives a ``--dims``-dimensional projection, the input layer of a ``--dims`` → 1000 → 10 MLP
trained with DP-SGD. Both spend from one budget: the PCA's event (σ_p calibrated so that it
alone costs ``--pca-share`` × ε, or ``--pca-noise-multiplier`` as in the paper) is composed
(RDP) with the DP-SGD events, whose σ is calibrated for the rest; every ε reported is read
from a ledger holding both. With ``--clients K`` it runs across K Flower nodes (Flower's
simulation engine), each reading its IID share of MNIST from its own policy's ``data-dir``:
each node books its release in its durable ledger and sends its noisy matrix, the server adds
them and builds the projection; then ``--epochs`` rounds of FedAvg, in each of which every
node runs one local epoch of DP-SGD on its projected share (at the centralized run's rate q,
so σ is the same), booking the round in its ledger first. Each client's ε is read from its
node's ledger. Prints a summary (accuracy, ε of the PCA and of the whole run, each client's ε),
then the JSON object: written to ``--out``, else printed as the last line. With ``--clients``,
Flower's and Ray's notices go to a log file (beside ``--out``) instead of the terminal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulations._cli import Parser, at_least, delta, positive, probability
from simulations._logging import command_log
from simulations._summary import epsilon_line, flower_console, metric_text, report

if TYPE_CHECKING:
    import torch

    from fedpriv.privacy import PrivacyLedger
    from fedpriv.privacy.events import DpEvent
    from fedpriv.training import TrainingPlan

PROG = "python -m simulations.dppca"
PCA_ENTRY, TRAIN_ENTRY = "dppca/projection", "dppca/train/epoch-{}"


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--epsilon", type=positive, required=True, help="ε of the whole run (PCA and training), per record")
    p.add_argument("--delta", type=delta, default=1e-5, help="(default: 1e-5)")
    p.add_argument("--clients", type=at_least(1), help="run across K Flower nodes (default: centralized)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--pca-share", type=share, default=0.15,
                       help="fraction of ε the PCA's event may cost alone (default: 0.15)")
    split.add_argument("--pca-noise-multiplier", type=positive, help="fixed σ_p instead (the paper: 4, 7 or 16)")
    p.add_argument("--pca-sample-rate", type=probability, default=1.0,
                   help="Poisson rate of the PCA's sample (default: 1, the best signal per ε)")
    p.add_argument("--dims", type=at_least(1), default=60, help="projection dimension (default: 60)")
    p.add_argument("--epochs", type=at_least(1), default=30,
                   help="DP-SGD epochs, or rounds with --clients (default: 30)")
    p.add_argument("--lot-size", type=at_least(1), default=600,
                   help="expected Poisson lot size (default: 600); with --clients, each node's is lot / K")
    p.add_argument("--max-grad-norm", type=positive, default=1.0, help="clipping norm C (default: 1)")
    p.add_argument("--lr", type=positive, default=0.2,
                   help="SGD learning rate (momentum 0.9), decayed by a half cosine over the epochs (default: 0.2)")
    p.add_argument("--seed", type=int, default=0, help="model init, sample, lots and noise (default: 0)")
    p.add_argument("--data-dir", help="root folder of the data sets, the server's and (with --clients) every "
                                     "node's policy data-dir (default: ~/.cache/fedpriv)")
    p.add_argument("--download", action="store_true", help="download MNIST if it is missing")
    p.add_argument("--limit-train", type=at_least(1), help="use the first N training examples")
    p.add_argument("--out", type=Path, help="write the JSON result to this file instead of printing it "
                                            "(with --clients: the run's log beside it, .log)")
    return p


def share(text: str) -> float:
    """A fraction in (0, 1): the PCA may not take the whole budget."""
    value = probability(text)
    if value == 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def pca_noise(args: argparse.Namespace) -> float:
    """σ_p: as given, or the smallest whose release alone costs ≤ share × ε."""
    from fedpriv.algorithms.dppca import calibrate_pca_noise

    if args.pca_noise_multiplier is not None:
        return args.pca_noise_multiplier
    return calibrate_pca_noise(args.pca_share * args.epsilon, args.delta, args.pca_sample_rate)


def training_plan(args: argparse.Namespace, num_examples: int, prior: DpEvent) -> TrainingPlan:
    """The MLP's DP-SGD plan, σ calibrated so that ``prior`` and ``--epochs`` epochs compose to ≤ ε."""
    from fedpriv.training import TrainingPlan, calibrate_plan

    plan = TrainingPlan(model="mlp", lot_size=args.lot_size, max_grad_norm=args.max_grad_norm, noise_multiplier=1.0,
                        lr=args.lr, lr_schedule="cosine", lr_decay_rounds=args.epochs)
    return calibrate_plan(plan, args.epsilon, args.delta, num_examples, args.epochs, prior_events=(prior,))


def progress(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def centralized(args: argparse.Namespace, sigma_p: float, train: Any, test: Any
                ) -> tuple[float, PrivacyLedger, TrainingPlan]:
    """(test accuracy, the ledger, the plan) of one run on the whole training set."""
    from fedpriv.algorithms import dppca
    from fedpriv.privacy import Budget, PrivacyLedger
    from fedpriv.seeding import generator

    event = dppca.pca_event(sigma_p, args.pca_sample_rate)
    plan = training_plan(args, len(train.labels), event)
    ledger = PrivacyLedger(Budget(epsilon=args.epsilon, delta=args.delta))
    ledger.record("0", PCA_ENTRY, (event,))  # booked before the data is read
    start = time.perf_counter()
    release = dppca.noisy_second_moment(train.features, sigma_p, args.pca_sample_rate,
                                        sampling_generator=generator(args.seed, "dppca", "sample"),
                                        noise_generator=generator(args.seed, "dppca", "noise"))
    projection = dppca.principal_projection(release.matrix, args.dims)
    progress(f"projection to {args.dims} dimensions (σ_p = {sigma_p:g}) in {time.perf_counter() - start:.1f} s")
    return train_mlp(args, plan, projection, train, test, ledger), ledger, plan


def federated(args: argparse.Namespace, sigma_p: float, train: Any, test: Any
              ) -> tuple[float, PrivacyLedger, TrainingPlan]:
    """Across K simulated Flower nodes: the projection from their noisy matrices, then
    ``--epochs`` FedAvg rounds of one local DP-SGD epoch each (``server.classic.loops.federated_dppca``).
    Every node samples at the centralized q = lot / N with the divisor q × N/K (the public
    share size), so one σ, calibrated with the PCA's event as a prior, serves every node.
    The ledger returned is the nodes' own entries, read back from their durable ledgers."""
    from flwr.serverapp import Grid

    from fedpriv.algorithms import dppca
    from fedpriv.privacy import Budget, PrivacyLedger
    from fedpriv.training import evaluate
    from server.classic import loops as classic
    from simulations._classic_nodes import run_on_nodes

    num_examples = len(train.labels)
    plan = training_plan(args, num_examples, dppca.pca_event(sigma_p, args.pca_sample_rate))
    q = plan.sample_rate(num_examples)
    training = classic.DppcaTraining(rounds=args.epochs, steps=plan.steps_per_round(num_examples), sample_rate=q,
                                     lot_size=q * num_examples / args.clients, noise_multiplier=plan.noise_multiplier,
                                     max_grad_norm=plan.max_grad_norm, lr=plan.lr)
    outcome: dict[str, Any] = {}
    start = time.perf_counter()

    def after_round(round_: int, model: torch.nn.Module, projection: torch.Tensor) -> None:
        outcome["model"] = model
        if round_ == 1:
            progress(f"projection from {args.clients} nodes (σ_p = {sigma_p:g} each), then FedAvg rounds of "
                     f"{training.steps} DP-SGD steps (σ = {plan.noise_multiplier:g}, q = {q:g}) on each node")
        if round_ % 5 == 0 or round_ == args.epochs:
            x_test = dppca.project(test.features, projection, dppca.INPUT_SCALE)
            progress(f"round {round_}/{args.epochs}: test accuracy {evaluate(model, x_test, test.labels)[1]:.4f} "
                     f"({time.perf_counter() - start:.0f} s)")

    def server(grid: Grid) -> None:
        outcome["projection"], outcome["model"], outcome["shares"] = classic.federated_dppca(
            grid, args.seed, sigma_p, args.pca_sample_rate, args.dims, train.features[0].numel(), args.limit_train,
            training, after_round)

    policy = {"epsilon-budget": args.epsilon, "delta": args.delta, "randomness": "seeded", "seed": args.seed}
    if args.data_dir is not None:  # the nodes' own data folder (Ray workers' cwd differs: absolute)
        policy["data-dir"] = str(Path(args.data_dir).resolve())
    ledgers = run_on_nodes(PROG, server, args.clients, policy)
    ledger = PrivacyLedger(Budget(epsilon=args.epsilon, delta=args.delta))
    for client, booked in ledgers.items():
        for entry, events in (booked.entries(client) if booked is not None else {}).items():
            ledger.record(client, entry, events)
    if outcome["shares"].refused:
        progress(f"refused or dropped: {outcome['shares'].refused}")
    x_test = dppca.project(test.features, outcome["projection"], dppca.INPUT_SCALE)
    return evaluate(outcome["model"], x_test, test.labels)[1], ledger, plan


def train_mlp(args: argparse.Namespace, plan: TrainingPlan, projection: torch.Tensor, train: Any, test: Any,
              ledger: PrivacyLedger) -> float:
    """DP-SGD of the MLP on the projected images, each epoch booked for every client of
    ``ledger`` first (every record is in the training); the test accuracy."""
    from fedpriv.algorithms import dppca
    from fedpriv.models import build_model
    from fedpriv.seeding import SIMULATION_RUN_ID, seeded_training_seed
    from fedpriv.training import evaluate, train_round

    x_train, x_test = (dppca.project(part.features, projection, dppca.INPUT_SCALE) for part in (train, test))
    progress(f"DP-SGD σ = {plan.noise_multiplier:g} for {args.epochs} epochs")
    model = build_model("mlp", args.seed, in_features=args.dims)
    for epoch in range(1, args.epochs + 1):
        for client in ledger.clients():  # raises past the budget
            ledger.record(client, TRAIN_ENTRY.format(epoch), plan.round_events(len(train.labels)))
        seed = seeded_training_seed(args.seed, SIMULATION_RUN_ID, ordinal=epoch)
        report = train_round(model, x_train, train.labels, plan, seed=seed, client=0, round_=epoch, device="cpu")
        if epoch % 5 == 0 or epoch == args.epochs:
            progress(f"epoch {epoch}/{args.epochs}: loss {report.mean_loss:.3f}, "
                     f"test accuracy {evaluate(model, x_test, test.labels)[1]:.4f}")
    return evaluate(model, x_test, test.labels)[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One run as the JSON object the command prints."""
    from fedpriv.algorithms.dppca import pca_event
    from fedpriv.data import load_dataset
    from fedpriv.privacy import epsilon_of, event_to_dict

    start = time.perf_counter()
    sigma_p = pca_noise(args)
    train = load_dataset("mnist", args.data_dir, train=True, download=args.download, limit=args.limit_train)
    test = load_dataset("mnist", args.data_dir, train=False, download=args.download)
    accuracy, ledger, plan = (federated if args.clients else centralized)(args, sigma_p, train, test)
    spent = {client: ledger.spent(client) for client in ledger.clients()}
    num_examples = len(train.labels)
    return {
        "accuracy": accuracy,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "pca_epsilon": epsilon_of(pca_event(sigma_p, args.pca_sample_rate), args.delta),
        "total_epsilon": max(spent.values()),
        "client_epsilon": spent,
        "randomness": "seeded",  # the noise is drawn from --seed
        "clients": args.clients or 1,
        "training": "fedavg" if args.clients else "central",
        "pca_noise_multiplier": sigma_p,
        "pca_sample_rate": args.pca_sample_rate,
        "dims": args.dims,
        "noise_multiplier": plan.noise_multiplier,
        "max_grad_norm": plan.max_grad_norm,
        "sample_rate": plan.sample_rate(num_examples),
        "lot_size": plan.lot_size,
        "lr": plan.lr,
        "epochs": args.epochs,
        "steps": args.epochs * plan.steps_per_round(num_examples),
        "num_examples": len(train.labels),
        "seed": args.seed,
        "seconds": round(time.perf_counter() - start, 1),
        "ledger": {client: {entry: [event_to_dict(e) for e in events]
                            for entry, events in ledger.entries(client).items()} for client in ledger.clients()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    from fedpriv.data import DatasetNotFoundError, check_available

    try:  # every input checked before any data is loaded
        check_available("mnist", args.data_dir, args.download)
        pca_noise(args)
    except (DatasetNotFoundError, ValueError) as err:
        parser.error(str(err))
    try:
        with command_log(PROG, args.out) as log, flower_console(bool(args.clients), log):
            result = run(args)
    except (DatasetNotFoundError, ValueError) as err:  # e.g. a budget the PCA alone exhausts
        parser.error(str(err))
    report(summary_lines(result), result, args.out, log)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The run in three lines: what ran, its accuracy, the ε it spent."""
    where = f"FedAvg across {result['clients']} Flower clients" if result["training"] == "fedavg" else "centralized"
    return [
        (f"DP-PCA to {result['dims']} dimensions + MLP on MNIST, {result['epochs']} epochs, {where}, "
         f"ε = {result['epsilon']:g} (the PCA's {result['pca_epsilon']:.4f})"),
        f"test accuracy: {metric_text('accuracy', result['accuracy'])}",
        epsilon_line(result["client_epsilon"], result["delta"],
                     "each node's ledger" if result["training"] == "fedavg" else "ledger"),
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
