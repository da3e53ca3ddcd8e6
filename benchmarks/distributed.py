"""Local vs distributed vs centralized DP-SGD on MNIST at the same ε and the same steps.

``python -m benchmarks.distributed --clients 1 10 100 --target-epsilon 2 [--limit-train n]
[--data-dir D] [--partition iid|dirichlet --alpha A] [--modes ...] --out F.json [--plot P.png]``

- centralized: ``simulations.centralized`` for E epochs of steps_per_epoch(q) steps each;
- local: ``simulations.mnist --privacy local --clients K --rounds E`` (each round one local
  epoch at the shared q of the data set's lot: every update noised on its node);
- distributed: ``simulations.mnist --privacy distributed --clients K --rounds E·steps_per_epoch(q)``
  (one step per round on the union; the noise shares sum to the centralized σ).

Centralized and distributed share the lot: ``--lot-size``, by default distributed mode's own
choice (``fedpriv.distributed.setup.large_lot``: N / 3, three steps an epoch, so full MNIST
is 120 rounds); above 21 clients distributed mode runs SecAgg+ on a sparse graph of 20
neighbours unless ``--secagg-neighbours`` says otherwise (a 100-node round: about 10 s
against 77 s on the full graph, docs/distributed.md).

Each point is one command in its own process (its own Ray), all with the same seed, δ and
plan. Centralized and local calibrate σ for the target ε (the same σ: the same event).
Distributed runs at that same σ (``--distributed-sigma same``, the default), so its accuracy
is compared at equal noise and its ε is what its nodes' ledgers book for it: the sound
subsampling bound for the discrete mechanism (``docs/accounting.md``) is larger than the
Gaussian's. ``--distributed-sigma target`` calibrates it for the target ε instead.
Writes ``{"seconds": the whole command's, "lot_size", "points": [{"mode", "clients", "accuracy",
"epsilon", "noise_multiplier", "steps", "seconds"}, ...]}`` (federated points add ``rounds`` and ``round_seconds``, the
mean time of a round's training phase: secure aggregation's overhead against local mode);
the centralized point has clients 1.

``--from F.json [G.json ...]`` runs nothing: it merges earlier reports (each point keeps its
report's partition), prints the table and writes ``--out`` and ``--plot`` (the README's
figure is ``distributed-quick.json`` with ``distributed-quick-100-dirichlet.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedpriv.distributed.setup import large_lot
from fedpriv.dpsgd.config import steps_per_epoch
from fedpriv.training import default_epochs
from simulations._cli import Parser, at_least, even_or_zero, positive

DATASET = "mnist"
SPARSE_NEIGHBOURS = 20
"""SecAgg+'s neighbours per node where the full graph would have more."""


def neighbours(args: argparse.Namespace, clients: int) -> int:
    """SecAgg+'s neighbours for ``clients`` nodes: the flag's, else the sparse graph's above 21 nodes."""
    if args.secagg_neighbours is not None:
        return args.secagg_neighbours
    return SPARSE_NEIGHBOURS if clients > SPARSE_NEIGHBOURS + 1 else 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m benchmarks.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=at_least(1), nargs="+", default=[1, 10, 100])
    p.add_argument("--target-epsilon", type=positive, default=2.0)
    p.add_argument("--delta", type=positive, default=1e-5)
    p.add_argument("--epochs", type=at_least(1), help="default: the data set's for the target ε")
    p.add_argument("--limit-train", type=at_least(1), help="use the first N training examples (default: all)")
    p.add_argument("--partition", choices=["iid", "dirichlet"], default="iid")
    p.add_argument("--alpha", type=positive, default=0.5)
    p.add_argument("--modes", nargs="+", choices=["centralized", "local", "distributed"],
                   default=["centralized", "local", "distributed"])
    p.add_argument("--distributed-sigma", choices=["same", "target"], default="same",
                   help="distributed mode at the centralized σ (same) or calibrated for --target-epsilon")
    p.add_argument("--secagg-neighbours", type=even_or_zero, metavar="K",
                   help=f"distributed mode: SecAgg+ neighbours per node (even; 0: all others; default: "
                        f"{SPARSE_NEIGHBOURS} above {SPARSE_NEIGHBOURS + 1} clients, else 0)")
    p.add_argument("--lot-size", type=at_least(1), help="the expected lot of centralized and distributed mode "
                                                         "(default: distributed mode's, N / 3)")
    p.add_argument("--data-dir")
    p.add_argument("--from", dest="reports", nargs="+", type=Path, metavar="JSON",
                   help="merge these reports instead of running (table, --out, --plot)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON results")
    p.add_argument("--plot", help="PNG: accuracy against clients, one line per mode")
    return p


def _run(command: list[str]) -> tuple[dict[str, Any], float]:
    """(results.json of a simulation, or the centralized JSON; wall seconds)."""
    start = time.perf_counter()
    print("$", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    out = Path(command[command.index("--out") + 1])
    return json.loads((out / "results.json" if out.is_dir() else out).read_text()), seconds


def merged(paths: list[Path]) -> dict[str, Any]:
    """The points of several reports (of the same ε, δ and steps), each with its partition."""
    reports = [json.loads(path.read_text()) for path in paths]
    keys = ("target_epsilon", "delta", "epochs", "limit_train")
    if any(tuple(r[k] for k in keys) != tuple(reports[0][k] for k in keys) for r in reports):
        raise SystemExit(f"error: the reports differ in one of {', '.join(keys)}")
    points = [{**p, "partition": p.get("partition", "-" if p["mode"] == "centralized" else _partition(r))}
              for r in reports for p in r["points"]]
    return {**{k: reports[0][k] for k in keys}, "merged_from": [str(path) for path in paths], "points": points}


def _partition(report: dict[str, Any]) -> str:
    return f"dirichlet {report['alpha']:g}" if report.get("partition") == "dirichlet" else "iid"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.reports:
        return _write(merged(args.reports), args)
    start = time.perf_counter()
    epochs = args.epochs or default_epochs(DATASET, args.target_epsilon)
    n = args.limit_train or 60_000
    lot = args.lot_size or large_lot(n)
    steps = epochs * steps_per_epoch(min(1.0, lot / n))
    target = ["--target-epsilon", str(args.target_epsilon)]
    common = ["--delta", str(args.delta), "--seed", str(args.seed)]
    common += ["--data-dir", args.data_dir] if args.data_dir else []
    common += ["--limit-train", str(args.limit_train)] if args.limit_train else []
    points = []
    with tempfile.TemporaryDirectory(prefix="fedpriv-distributed-") as tmp:
        out = str(Path(tmp) / "centralized.json")  # always: its σ is the distributed runs'
        result, seconds = _run([sys.executable, "-m", "simulations.centralized", *common, *target,
                                "--epochs", str(epochs), "--lot-size", str(lot), "--out", out])
        sigma = result["noise_multiplier"]
        if "centralized" in args.modes:
            points.append({"mode": "centralized", "clients": 1, "accuracy": result["accuracy"],
                           "epsilon": result["epsilon"], "noise_multiplier": sigma,
                           "steps": result["steps"], "seconds": seconds})
        for clients in args.clients:
            for mode in (m for m in ("local", "distributed") if m in args.modes):
                out = str(Path(tmp) / f"{mode}-{clients}")
                partition = ["--partition", args.partition] + (
                    ["--alpha", str(args.alpha)] if args.partition == "dirichlet" else [])
                rounds = epochs if mode == "local" else steps
                noise = ["--noise-multiplier", str(sigma)] if mode == "distributed" and \
                    args.distributed_sigma == "same" else target
                result, seconds = _run([sys.executable, "-m", "simulations.mnist", *common, *noise, *partition,
                                        "--privacy", mode, "--clients", str(clients), "--rounds", str(rounds),
                                        *(["--secagg-neighbours", str(neighbours(args, clients)), "--lot-size",
                                           str(lot)] if mode == "distributed" else []),
                                        "--fraction-evaluate", "0", "--out", out])
                resolved = result["resolved"]
                sigma = resolved.get("noise_multiplier") or next(iter(resolved["clients"].values()))["noise_multiplier"]
                points.append({"mode": mode, "clients": clients, "partition": _partition(vars(args)),
                               "accuracy": result["final_accuracy"],
                               "epsilon": max(result["node_epsilon"].values()), "noise_multiplier": sigma,
                               "steps": len(result["rounds"]) * (1 if mode == "distributed" else next(
                                   iter(resolved["clients"].values()))["steps_per_round"]),
                               "seconds": seconds, "rounds": len(result["rounds"]),
                               "round_seconds": statistics.mean(r["train_seconds"] for r in result["rounds"])})
                print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    report = {"seconds": time.perf_counter() - start, "target_epsilon": args.target_epsilon,
              "distributed_sigma": args.distributed_sigma, "delta": args.delta, "epochs": epochs, "lot_size": lot,
              "limit_train": args.limit_train, "partition": args.partition,
              "alpha": args.alpha if args.partition == "dirichlet" else None, "points": points}
    return _write(report, args)


def _write(report: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(table(report["points"]))
    if args.plot:
        plot(report, Path(args.plot))
    return report


def table(points: list[dict[str, Any]]) -> str:
    """One line per point: mode, clients, partition, accuracy, ε, σ, steps, seconds."""
    lines = [f"{'mode':<12}{'clients':>8}  {'partition':<14}{'accuracy':>9}{'epsilon':>9}{'sigma':>8}{'steps':>7}"
             f"{'seconds':>9}"]
    for p in points:
        lines.append(f"{p['mode']:<12}{p['clients']:>8}  {p.get('partition', '-'):<14}{100 * p['accuracy']:>8.2f}%"
                     f"{p['epsilon']:>9.3f}{p['noise_multiplier']:>8.3f}{p['steps']:>7}{p['seconds']:>9.1f}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Accuracy against the number of clients: local and distributed, the centralized line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    federated = [p for p in report["points"] if p["mode"] != "centralized"]
    partitions = sorted({p.get("partition", "iid") for p in federated})
    for mode, style in (("local", "o"), ("distributed", "s")):
        for partition, line in zip(partitions, ("-", "--", ":"), strict=False):
            pts = sorted((p["clients"], 100 * p["accuracy"]) for p in federated
                         if p["mode"] == mode and p.get("partition", "iid") == partition)
            label = f"{mode} DP" + (f", {partition.replace('dirichlet', 'Dirichlet')}" if len(partitions) > 1 else "")
            if pts:
                ax.plot(*zip(*pts, strict=True), style + line, label=label)
    for accuracy in sorted({p["accuracy"] for p in report["points"] if p["mode"] == "centralized"}):
        ax.axhline(100 * accuracy, color="grey", linestyle="--", label="centralized")
    ax.set_xscale("log")
    ax.set_xlabel("clients")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"MNIST, ε = {report['target_epsilon']:g}, same steps")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
