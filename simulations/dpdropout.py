"""DP dropout and its baselines (Ermiş & Cemgil):
``python -m simulations.dpdropout --dataset digits --method dpd --epsilon 1``.

Trains the paper's one-hidden-layer network with ``dpd`` (Gaussian dropout, per-layer
clipping, η0/t), ``sgld`` (the same without dropout) or ``dpsgd`` (Abadi et al.), with σ
from a sound accountant (``--accountant``, RDP by default), and prints a summary (σ,
accuracy, each client's ε), then one JSON object (written to ``--out``, else printed as the
last line): ``dataset, method, epsilon, delta, accountant, noise_multiplier, accuracy, epochs,
seconds, client_epsilon`` (each client's ε read from a ledger). ``--clients K`` trains across K
Flower nodes (FedAvg of local DPD, each node booking in its own ledger; Flower's and Ray's
notices go to a log file, beside ``--out``, instead of the terminal). ``--table`` runs
Table 1's grid (ε = 10, 1, 0.5; every method; ``--seeds`` seeds) and prints Markdown beside
the paper's numbers. ``--paper-recipe`` trains with the paper's σ instead (its analysis, not
a guarantee; the sound ε of that σ is printed next to it). See docs/dpdropout.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from simulations._cli import Parser, at_least, delta, positive, unit_interval, write_out
from simulations._logging import command_log
from simulations._summary import epsilon_line, flower_console, metric_text, report

PROG = "python -m simulations.dpdropout"
DATASETS = ("mnist", "digits")
METHODS = ("dpd", "sgld", "dpsgd")
ACCOUNTANTS = ("rdp", "pld", "zcdp", "advanced", "basic")
TABLE_EPSILONS = (10.0, 1.0, 0.5)
PAPER_TABLE = {  # Table 1 (δ = 1e-4): accuracy at ε = 10, 1, 0.5
    "mnist": {"DPD-AC": (0.9526, 0.9187, 0.8658), "DPD-zCDP": (0.9718, 0.9470, 0.9205),
              "SGLD-zCDP (no dropout)": (0.9581, 0.9216, 0.8952), "Abadi et al.": (0.9720, 0.9305, 0.8965)},
    "digits": {"DPD-AC": (0.9341, 0.9089, 0.8521), "DPD-zCDP": (0.9518, 0.9367, 0.9125),
               "SGLD-zCDP (no dropout)": (0.9403, 0.9187, 0.8821), "Abadi et al.": (0.9480, 0.9265, 0.9003)},
}


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=DATASETS, required=True)
    p.add_argument("--method", choices=METHODS, help="(default: dpd; with --table: all three)")
    p.add_argument("--epsilon", type=positive, help="ε of the whole training, per record (required unless --table)")
    p.add_argument("--delta", type=delta, default=1e-4, help="δ of the guarantee (default: 1e-4, the paper's)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp",
                   help="sound accountant that calibrates σ and reads the ledger (default: rdp)")
    p.add_argument("--paper-recipe", choices=("zcdp", "ac"),
                   help="train with the paper's σ for --epsilon instead (NOT a guarantee: the JSON and stderr "
                        "carry the sound ε of that σ)")
    p.add_argument("--clients", type=at_least(2), help="federated: K Flower nodes, FedAvg of local training")
    p.add_argument("--seed", type=int, default=0, help="data split, init, lots, noise and dropout (default: 0)")
    p.add_argument("--table", action="store_true", help="Table 1's grid: ε = 10, 1, 0.5 × methods × --seeds")
    p.add_argument("--seeds", type=at_least(3), default=3, help="seeds per cell of --table (default: 3)")
    p.add_argument("--epochs", type=at_least(1), help="epochs (federated: rounds of one local epoch) "
                                                      "(default: the method's, docs/dpdropout.md)")
    p.add_argument("--lot-size", type=at_least(1), help="expected Poisson lot size S (default: the method's)")
    p.add_argument("--max-grad-norm", type=positive, help="per-layer clipping norm C (default: the method's)")
    p.add_argument("--lr", type=positive, help="initial step η0 (default: the method's)")
    p.add_argument("--dropout", type=unit_interval, help="dpd's Gaussian dropout rate p < 1 (default: the method's)")
    p.add_argument("--data-dir", help="root folder of MNIST (default: $XDG_CACHE_HOME/fedpriv or ~/.cache/fedpriv)")
    p.add_argument("--out", type=Path, help="write the JSON here instead of printing it (--table: and the "
                                            "Markdown beside it, .md; --clients: the run's log, .log)")
    return p


def check_args(parser: Parser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot check; one line and exit 2."""
    if args.table:
        for flag, value in (("--epsilon", args.epsilon), ("--clients", args.clients),
                            ("--paper-recipe", args.paper_recipe)):
            if value is not None:
                parser.error(f"{flag} does not go with --table (it runs ε = 10, 1, 0.5, centralized, sound σ)")
    elif args.epsilon is None:
        parser.error("argument --epsilon is required (or --table)")
    if args.clients and args.dataset != "digits":
        parser.error("argument --clients: the federated run is on digits only")
    if args.dropout is not None:
        if args.dropout >= 1:
            parser.error(f"argument --dropout: must be < 1, got {args.dropout:g}")
        if args.method not in (None, "dpd"):
            parser.error(f"argument --dropout: only dpd has dropout, not {args.method}")


def settings_for(args: argparse.Namespace, method: str) -> Any:
    from fedpriv.algorithms import dpdropout

    return dpdropout.settings(args.dataset, method, epochs=args.epochs, lot_size=args.lot_size,
                              max_grad_norm=args.max_grad_norm, lr=args.lr,
                              dropout=args.dropout if method == "dpd" else None)


def load(dataset: str, data_dir: str | None, seed: int) -> tuple[Any, Any, Any, Any]:
    """(x, y, x_test, y_test); DIGITS' split depends on ``seed``."""
    from fedpriv.data import load_dataset

    train, test = (load_dataset(dataset, data_dir, train=t, seed=seed) for t in (True, False))
    return train.features, train.labels, test.features, test.labels


def noise_multiplier(args: argparse.Namespace, settings: Any, epsilon: float, num_examples: int) -> tuple[float, dict]:
    """σ and what to say about it: calibrated by the sound accountant, or (``--paper-recipe``)
    the paper's σ, with the sound ε of that σ beside it."""
    from fedpriv.algorithms import dpdropout
    from fedpriv.privacy import dpdropout as paper
    from fedpriv.privacy import dpsgd_event, epsilon_of

    if args.paper_recipe is None:
        return dpdropout.calibrate(settings, epsilon, args.delta, num_examples, args.accountant), {}
    q, steps = settings.sample_rate(num_examples), settings.steps(num_examples)
    if args.paper_recipe == "zcdp":
        sigma = paper.paper_zcdp_sigma(epsilon, q, steps, args.delta, args.delta)
    else:
        sigma = paper.paper_ac_sigma(epsilon, q, steps, args.delta, args.delta / 2)
    sound = epsilon_of(dpsgd_event(sigma, q, steps), args.delta, args.accountant)
    print(f"{PROG}: σ = {sigma:.4g} is the paper's DPD-{args.paper_recipe} analysis for ε = {epsilon:g} — not a "
          f"guarantee; the sound ({args.accountant}) ε of this σ is {sound:.4g} at δ = {args.delta:g}",
          file=sys.stderr)
    return sigma, {"paper_recipe": f"DPD-{args.paper_recipe} (the paper's analysis, not a guarantee)",
                   "sound_epsilon": sound}


def centralized(args: argparse.Namespace, method: str, epsilon: float, seed: int,
                log_every: int | None = None) -> dict[str, Any]:
    """One training on the whole training set; ε read back from a ledger of its events."""
    from fedpriv.algorithms import dpdropout
    from fedpriv.privacy import Budget, PrivacyLedger

    settings = settings_for(args, method)
    x, y, x_test, y_test = load(args.dataset, args.data_dir, seed)
    sigma, paper = noise_multiplier(args, settings, epsilon, len(y))
    model = dpdropout.network(x[0].numel(), settings, seed)
    start = time.perf_counter()

    def progress(epoch: int, loss: float) -> None:
        if log_every and (epoch % log_every == 0 or epoch == settings.epochs):
            print(f"{PROG}: {method} epoch {epoch}/{settings.epochs}: loss {loss:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    events = dpdropout.train(model, x, y, settings, sigma, seed=seed, progress=progress)
    seconds = time.perf_counter() - start
    ledger = PrivacyLedger(Budget(epsilon=paper.get("sound_epsilon", epsilon) * (1 + 1e-9), delta=args.delta),
                           accountant=args.accountant)
    ledger.record("0", f"dpdropout/{method}", events)
    return result(args, method, epsilon, sigma, dpdropout.accuracy(model, x_test, y_test), settings, seconds,
                  {"0": ledger.spent("0")}, seed, **paper)


def federated(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """FedAvg of local training across ``--clients`` nodes in Flower's simulation engine
    (``clients.classic.client_app``'s ``dpdropout`` release, ``server.classic.loops.federated_dpdropout``):
    one local epoch per round, rounds = epochs, every node at the centralized q; each node
    books every round in its own durable ledger before reading its data, and its ε is read
    back from that ledger."""
    import dataclasses

    import torch
    from flwr.serverapp import Grid

    from fedpriv.algorithms import dpdropout
    from fedpriv.algorithms.datasets import load as load_split
    from server.classic.loops import federated_dpdropout
    from simulations._classic_nodes import check_answered, run_on_nodes

    _, y, x_test, y_test = load_split(args.dataset, args.seed)
    share_size = len(y) / args.clients  # public: an IID split of a data set of public size
    base = settings_for(args, method)
    settings = dataclasses.replace(base, fixed_sample_rate=base.sample_rate(len(y)))
    sigma, paper = noise_multiplier(args, settings, args.epsilon, len(y))
    outcome: dict[str, Any] = {}

    def server(grid: Grid) -> None:
        outcome["model"], outcome["shares"] = federated_dpdropout(grid, args.dataset, args.seed, settings, sigma,
                                                                  share_size)

    start = time.perf_counter()
    ledgers = run_on_nodes(PROG, server, args.clients, {
        "epsilon-budget": paper.get("sound_epsilon", args.epsilon) * (1 + 1e-9), "delta": args.delta,
        "accountant": args.accountant, "randomness": "seeded", "seed": args.seed})
    check_answered(PROG, outcome["shares"], args.clients)
    spent = {client: 0.0 if ledger is None else ledger.spent_at(client, args.delta)
             for client, ledger in ledgers.items()}
    accuracy = dpdropout.accuracy(outcome["model"], dpdropout.digits_features(x_test),
                                  torch.as_tensor(y_test, dtype=torch.long))
    return result(args, method, args.epsilon, sigma, accuracy, settings, time.perf_counter() - start, spent,
                  args.seed, refused=outcome["shares"].refused, **paper)


def result(args: argparse.Namespace, method: str, epsilon: float, sigma: float, accuracy: float, settings: Any,
           seconds: float, client_epsilon: dict[str, float], seed: int, **extra: Any) -> dict[str, Any]:
    """The JSON object of one run."""
    return {"dataset": args.dataset, "method": method, "epsilon": epsilon, "delta": args.delta,
            "accountant": args.accountant, "noise_multiplier": sigma, "accuracy": accuracy,
            "epochs": settings.epochs, "seconds": round(seconds, 2), "client_epsilon": client_epsilon,
            "seed": seed, "clients": args.clients or 1, "lot_size": settings.lot_size,
            "max_grad_norm": settings.max_grad_norm, "lr": settings.lr, "dropout": settings.dropout,
            "randomness": "seeded", **extra}  # the noise is drawn from --seed


def table(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Every (method, ε, seed) of the grid: the runs, and Markdown beside the paper's Table 1."""
    methods = [args.method] if args.method else list(METHODS)
    runs = []
    total = len(methods) * len(TABLE_EPSILONS) * args.seeds
    for method in methods:
        for epsilon in TABLE_EPSILONS:
            for seed in range(args.seeds):
                runs.append(centralized(args, method, epsilon, seed))
                r = runs[-1]
                print(f"{PROG}: [{len(runs)}/{total}] {args.dataset} {method} ε = {epsilon:g} seed {seed}: "
                      f"accuracy {r['accuracy']:.4f}, σ = {r['noise_multiplier']:g} ({r['seconds']:.1f} s)",
                      file=sys.stderr, flush=True)
    return {"dataset": args.dataset, "delta": args.delta, "accountant": args.accountant, "runs": runs}, \
        markdown(args, methods, runs)


def markdown(args: argparse.Namespace, methods: list[str], runs: list[dict[str, Any]]) -> str:
    """Mean ± std per (method, ε), then the paper's rows."""
    eps_head = " | ".join(f"ε = {e:g}" for e in TABLE_EPSILONS)
    lines = [f"{args.dataset.upper()}, δ = {args.delta:g}, σ from `{args.accountant}` (sound), "
             f"mean ± std of {args.seeds} seeds; the paper's rows use its own (unsound) σ",
             "", f"| method | {eps_head} | σ | epochs | lot | C | η0 |",
             "| --- | " + " | ".join("---" for _ in TABLE_EPSILONS) + " | --- | --- | --- | --- | --- |"]
    for method in methods:
        cells, sigmas = [], []
        for epsilon in TABLE_EPSILONS:
            cell = [r for r in runs if r["method"] == method and r["epsilon"] == epsilon]
            acc = [r["accuracy"] for r in cell]
            cells.append(f"{statistics.mean(acc):.4f} ± {statistics.stdev(acc):.4f}")
            sigmas.append(cell[0]["noise_multiplier"])
        first = next(r for r in runs if r["method"] == method)
        lines.append(f"| **{method}** (fedpriv) | " + " | ".join(cells) + f" | {' / '.join(f'{s:g}' for s in sigmas)} "
                     f"| {first['epochs']} | {first['lot_size']} | {first['max_grad_norm']:g} | {first['lr']:g} |")
    for name, values in PAPER_TABLE[args.dataset].items():
        lines.append(f"| {name} (paper) | " + " | ".join(f"{v:.4f}" for v in values) + " | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    from fedpriv.data import DatasetNotFoundError, check_available

    try:  # every input checked before any data is loaded or trained on
        for method in [args.method] if args.method else list(METHODS):
            settings_for(args, method)
        check_available(args.dataset, args.data_dir)
    except (DatasetNotFoundError, ValueError) as err:
        parser.error(str(err))
    if args.table:
        outcome, text = table(args)
        print(text, end="")
        write_out(args.out, json.dumps(outcome, indent=1))
        if args.out is not None:
            args.out.with_suffix(".md").write_text(text)
        return outcome
    method = args.method or "dpd"
    log: Path | None = None  # a federated run's, where it is kept
    try:
        if args.clients:
            with command_log(PROG, args.out) as log, flower_console(True, log):
                outcome = federated(args, method)
        else:
            outcome = centralized(args, method, args.epsilon, args.seed,
                                  log_every=max(1, settings_for(args, method).epochs // 10))
    except ValueError as err:  # e.g. a target ε out of the accountant's reach
        parser.error(str(err))
    report(summary_lines(outcome), outcome, args.out, log)
    return outcome


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The run in three lines: what ran (σ and how it was chosen), its accuracy, each client's ε."""
    where = f"FedAvg across {result['clients']} Flower clients" if result["clients"] > 1 else "centralized"
    chosen = result.get("paper_recipe") or f"calibrated by {result['accountant']}"
    return [
        (f"{result['method']} on {result['dataset']}, {result['epochs']} epochs, {where}, ε = {result['epsilon']:g}, "
         f"σ = {result['noise_multiplier']:.4g} ({chosen})"),
        f"test accuracy: {metric_text('accuracy', result['accuracy'])}",
        epsilon_line(result["client_epsilon"], result["delta"],
                     f"each node's ledger, {result['accountant']}" if result["clients"] > 1 else result["accountant"]),
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
