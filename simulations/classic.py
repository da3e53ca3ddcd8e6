"""The classic DP algorithms of the seed papers: ``python -m simulations.classic ALGORITHM --epsilon E``.

ALGORITHM: ``linreg`` (functional mechanism, diabetes), ``kmeans-dplloyd`` and
``kmeans-input`` (iris), ``ann-iris`` (DP-SGD, 5-fold cross-validation; ε for the whole
procedure; federated: trained on the training split, tested on the test split) and
``output-perturbation`` (ε per answered query; iris). Centralized by default; ``--clients K``
runs every algorithm but ``kmeans-input`` (local DP: nothing to federate) across K Flower
ClientApps in Flower's simulation engine, each node with its own policy and durable
ledger. ``diffprivlib_metric`` is diffprivlib's model of the same kind on the same split
and ε (LinearRegression, KMeans), null where it has none or is not installed. Prints a
summary (the metric beside the non-private and diffprivlib ones, each client's ε), then the
JSON object: written to ``--out``, else printed as the last line. Across clients, Flower's
and Ray's notices go to a log file (beside ``--out``) instead of the terminal.
``--sweep`` runs ε ∈ {0.1, 0.5, 1, 2, 5, 10} over several seeds and draws metric vs ε.
Bounds are stated here, not read off the data (docs/classic.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from simulations._cli import Parser, at_least, positive, write_out
from simulations._logging import command_log
from simulations._summary import epsilon_line, flower_console, metric_text, report

ALGORITHMS = {"linreg": "diabetes", "kmeans-dplloyd": "iris", "kmeans-input": "iris", "ann-iris": "iris",
              "output-perturbation": "iris"}
CLASSIFIERS = ("ann-iris", "output-perturbation")
FEDERATED = ("linreg", "kmeans-dplloyd", "ann-iris", "output-perturbation")
DELTA = 1e-5
PROG = "python -m simulations.classic"
SWEEP = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


def answers_budget(epsilon: float, answers: int) -> float:
    """The budget of ``answers`` answers at ε each: the smallest double ≥ their exact sum
    (each answer spends at most ε, its lattice rounding included; ledgers sum pure releases
    exactly and round up: ``fedpriv.privacy.accountants.pure``)."""
    from fractions import Fraction

    from fedpriv.privacy.accountants.pure import round_up

    return round_up(Fraction(epsilon) * answers)


def stated_bounds(algorithm: str) -> Any:
    """The bounds a user states for the data set (from its documentation, not its values)."""
    from fedpriv.algorithms import kmeans, linreg

    if algorithm == "linreg":  # diabetes: features standardised to |x| ≤ 0.2; target 25–346
        return linreg.Bounds(np.full(10, -0.2), np.full(10, 0.2), (25.0, 346.0))
    return kmeans.Box(np.zeros(4), np.full(4, 8.0))  # iris: lengths in cm, all under 8


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("algorithm", choices=sorted(ALGORITHMS))
    p.add_argument("--epsilon", type=positive, required=True, help="ε of the whole run, per record")
    p.add_argument("--clients", type=at_least(2), help=f"run across K Flower clients ({', '.join(FEDERATED)})")
    p.add_argument("--seed", type=int, default=0, help="data split, initial centroids and the noise (default: 0)")
    p.add_argument("--iterations", type=at_least(1), default=3, help="DPLloyd iterations (default: 3)")
    p.add_argument("--sweep", action="store_true", help=f"ε in {SWEEP}, 5 seeds each, and a plot (centralized)")
    p.add_argument("--out", type=Path, help="JSON file to write instead of printing it (with --sweep: also a PNG "
                                            "beside it; with --clients: the run's log, .log)")
    return p


def metric(algorithm: str, model: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Test MSE (linreg, target units) or clustering accuracy (k-means)."""
    from fedpriv.algorithms import kmeans, linreg

    if algorithm == "linreg":
        return float(np.mean((linreg.predict(model, x, stated_bounds(algorithm)) - y) ** 2))
    return kmeans.clustering_accuracy(y.astype(int), kmeans.assign(x, model))


def nonprivate(algorithm: str, seed: int) -> float:
    from sklearn.cluster import KMeans
    from sklearn.linear_model import LinearRegression

    from fedpriv.algorithms import iris
    from fedpriv.algorithms.datasets import load

    x, y, x_test, y_test = load(ALGORITHMS[algorithm], seed)
    if algorithm == "ann-iris":  # the same 5 folds, trained without privacy
        x_all, y_all = np.vstack([x, x_test]), np.concatenate([y, y_test]).astype(int)
        folds = np.array_split(np.random.default_rng(seed).permutation(len(y_all)), iris.FOLDS)
        return float(np.mean([iris.accuracy(iris.train_nonprivate(np.delete(x_all, f, 0), np.delete(y_all, f), seed),
                                            x_all[f], y_all[f]) for f in folds]))
    if algorithm == "output-perturbation":
        return iris.accuracy(iris.train_nonprivate(x, y.astype(int), seed), x_test, y_test.astype(int))
    if algorithm == "linreg":
        return float(np.mean((LinearRegression().fit(x, y).predict(x_test) - y_test) ** 2))
    labels = KMeans(3, n_init=10, random_state=seed).fit(x).predict(x_test)
    from fedpriv.algorithms.kmeans import clustering_accuracy

    return clustering_accuracy(y_test.astype(int), labels)


def _diffprivlib() -> Any:
    """diffprivlib's models, or None where it is not installed. diffprivlib 0.6.6 imports
    ``DOUBLE`` and ``DTYPE`` from ``sklearn.tree._tree`` for its random forest, aliases of
    float64/float32 that scikit-learn 1.6 dropped; they are put back before the import
    (fedpriv uses none of its tree models)."""
    import sklearn.tree._tree as tree

    for name, dtype in (("DOUBLE", np.float64), ("DTYPE", np.float32)):
        if not hasattr(tree, name):
            setattr(tree, name, dtype)
    try:
        import diffprivlib.models
    except ImportError:
        return None
    return diffprivlib.models


def diffprivlib_metric(algorithm: str, epsilon: float, seed: int) -> float | None:
    """The metric of diffprivlib's model of this kind at ε on the same split and bounds."""
    models = _diffprivlib() if algorithm in ("linreg", "kmeans-dplloyd", "kmeans-input") else None
    if models is None:
        return None
    import warnings

    from fedpriv.algorithms.datasets import load
    from fedpriv.algorithms.kmeans import clustering_accuracy

    x, y, x_test, y_test = load(ALGORITHMS[algorithm], seed)
    bounds = stated_bounds(algorithm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its PrivacyLeakWarning / DiffprivlibCompatibilityWarning
        if algorithm == "linreg":
            model = models.LinearRegression(epsilon=epsilon, bounds_X=(bounds.low, bounds.high),
                                            bounds_y=bounds.target, random_state=seed).fit(x, y)
            return float(np.mean((model.predict(x_test) - y_test) ** 2))
        model = models.KMeans(3, epsilon=epsilon, bounds=(bounds.low, bounds.high), random_state=seed).fit(x)
        return clustering_accuracy(y_test.astype(int), model.predict(x_test))


def centralized(algorithm: str, epsilon: float, seed: int, iterations: int) -> tuple[float, dict[str, float]]:
    """(metric, {"0": ε from a ledger}) of one centralized run."""
    from sklearn.cluster import KMeans

    from fedpriv.algorithms import kmeans, linreg
    from fedpriv.algorithms.datasets import load
    from fedpriv.privacy import Budget, PrivacyLedger

    x, y, x_test, y_test = load(ALGORITHMS[algorithm], seed)
    rng = np.random.default_rng(seed)
    if algorithm in CLASSIFIERS:
        return classifier(algorithm, epsilon, seed, x, y.astype(int), x_test, y_test.astype(int), rng)
    bounds = stated_bounds(algorithm)
    if algorithm == "linreg":
        model, event = linreg.fit(x, y, bounds, epsilon, rng=rng)
    elif algorithm == "kmeans-dplloyd":
        model, event = kmeans.dplloyd(x, 3, bounds, epsilon, iterations, rng=rng, init_rng=np.random.default_rng(seed))
    else:
        noisy, event = kmeans.perturb_inputs(x, bounds, epsilon, rng=rng)
        model = KMeans(3, n_init=10, random_state=seed).fit(noisy).cluster_centers_
    ledger = PrivacyLedger(Budget(epsilon=epsilon, delta=DELTA))
    ledger.record("0", f"{algorithm}/centralized", (event,))
    return metric(algorithm, model, x_test, y_test), {"0": ledger.spent("0")}


def classifier(algorithm: str, epsilon: float, seed: int, x: np.ndarray, y: np.ndarray, x_test: np.ndarray,
               y_test: np.ndarray, rng: np.random.Generator) -> tuple[float, dict[str, float]]:
    """(test accuracy, {"0": ε from the ledger}) of the DP-SGD ANN or output perturbation."""
    from fedpriv.algorithms import iris
    from fedpriv.privacy import Budget, PrivacyLedger

    if algorithm == "ann-iris":
        x_all, y_all = np.vstack([x, x_test]), np.concatenate([y, y_test])
        accuracy, events = iris.cross_validate(x_all, y_all, epsilon, DELTA, seed)
        ledger = PrivacyLedger(Budget(epsilon=epsilon, delta=DELTA))
        for fold, event in enumerate(events):
            ledger.record("0", f"ann-iris/fold-{fold}", (event,))
        return accuracy, {"0": ledger.spent("0")}
    ledger = PrivacyLedger(Budget(epsilon=answers_budget(epsilon, len(y_test)), delta=DELTA))
    answers = iris.PerturbedOutputs(iris.train_nonprivate(x, y, seed), epsilon, ledger, rng=rng)
    predicted = np.array([answers.answer(record).argmax() for record in x_test])
    return float((predicted == y_test).mean()), {"0": ledger.spent("0")}


def federated(
    algorithm: str, epsilon: float, seed: int, clients: int, iterations: int
) -> tuple[float, dict[str, float]]:
    """(metric, each node's ε from its own ledger) of a run across ``clients`` simulated nodes."""
    from flwr.serverapp import Grid

    from fedpriv.algorithms import iris
    from fedpriv.algorithms.datasets import load
    from server.classic import loops as classic
    from simulations._classic_nodes import check_answered, run_on_nodes

    dataset = ALGORITHMS[algorithm]
    x_train, _, x_test, y_test = load(dataset, seed)
    outcome: dict[str, float] = {}
    gathered: list[classic.Shares] = []

    def server(grid: Grid) -> None:
        bounds = stated_bounds(algorithm)
        if algorithm == "linreg":
            model, shares = classic.federated_linreg(grid, dataset, seed, epsilon, bounds)
            outcome["metric"] = metric(algorithm, model, x_test, y_test)
        elif algorithm == "kmeans-dplloyd":
            model, shares = classic.federated_dplloyd(grid, dataset, seed, epsilon, 3, bounds, iterations)
            outcome["metric"] = metric(algorithm, model, x_test, y_test)
        elif algorithm == "ann-iris":
            network, shares = classic.federated_ann(grid, dataset, seed, epsilon, DELTA, len(x_train) / clients)
            outcome["metric"] = iris.accuracy(network, x_test, y_test.astype(int))
        else:
            answers, shares = classic.federated_answers(grid, dataset, seed, epsilon, x_test)
            outcome["metric"] = float((answers.argmax(axis=1) == y_test).mean())
        gathered.append(shares)

    # each release spends at most its share of ε, and a ledger of pure (Laplace) releases
    # reports their exact sum where RDP's conversion would add a little: a budget of ε is enough
    budget = answers_budget(epsilon, len(y_test)) if algorithm == "output-perturbation" else epsilon
    ledgers = run_on_nodes(PROG, server, clients, {
        "epsilon-budget": budget, "delta": DELTA, "randomness": "seeded", "seed": seed})
    check_answered(PROG, gathered[0], clients)
    spent = {client: 0.0 if ledger is None else ledger.spent_at(client, DELTA) for client, ledger in ledgers.items()}
    return outcome["metric"], spent


def run(algorithm: str, epsilon: float, seed: int, clients: int | None, iterations: int) -> dict[str, Any]:
    """One run as the JSON object the command prints."""
    if clients:
        value, spent = federated(algorithm, epsilon, seed, clients, iterations)
    else:
        value, spent = centralized(algorithm, epsilon, seed, iterations)
    return {"algorithm": algorithm, "epsilon": epsilon, "clients": clients or 1,
            "metric_name": {"linreg": "test_mse", **dict.fromkeys(CLASSIFIERS, "test_accuracy")}.get(
                algorithm, "clustering_accuracy"), "metric": value,
            "nonprivate_metric": nonprivate(algorithm, seed),
            "diffprivlib_metric": diffprivlib_metric(algorithm, epsilon, seed),
            "client_epsilon": spent, "randomness": "seeded"}  # the noise is drawn from --seed


def sweep(algorithm: str, iterations: int, out: Path | None) -> dict[str, Any]:
    """Every ε of SWEEP over 5 seeds, centralized; a PNG beside ``out``."""
    points = [run(algorithm, epsilon, seed, None, iterations) for epsilon in SWEEP for seed in range(5)]

    def mean(key: str, e: float) -> float | None:
        values = [p[key] for p in points if p["epsilon"] == e and p[key] is not None]
        return float(np.mean(values)) if values else None

    summary: dict[str, Any] = {
        "algorithm": algorithm, "points": points, "mean": {str(e): mean("metric", e) for e in SWEEP},
        "diffprivlib_mean": {str(e): mean("diffprivlib_metric", e) for e in SWEEP},
        "nonprivate_metric": float(np.mean([p["nonprivate_metric"] for p in points]))}
    if out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(SWEEP, [summary["mean"][str(e)] for e in SWEEP], "o-", label=f"fedpriv {algorithm} (mean of 5 seeds)")
        if summary["diffprivlib_mean"][str(SWEEP[0])] is not None:
            ax.plot(SWEEP, [summary["diffprivlib_mean"][str(e)] for e in SWEEP], "s:", label="diffprivlib")
        ax.axhline(summary["nonprivate_metric"], color="k", ls="--", label="non-private")
        ax.set_xscale("log")
        if algorithm == "linreg":  # diffprivlib's regression errs by orders of magnitude
            ax.set_yscale("log")
        ax.set_xlabel("ε")
        ax.set_ylabel(points[0]["metric_name"].replace("_", " "))
        ax.legend()
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
        plt.close(fig)
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.clients and args.algorithm not in FEDERATED:
        parser.error(f"--clients: {args.algorithm} runs centralized only (federated: {', '.join(FEDERATED)})")
    if args.sweep and args.clients:
        parser.error("--sweep runs centralized; drop --clients")
    if args.sweep:
        result = sweep(args.algorithm, args.iterations, args.out)
        write_out(args.out, json.dumps(result, indent=2))
        print(json.dumps(result["mean"]))
        return result
    with command_log(PROG, args.out) as log, flower_console(bool(args.clients), log):
        result = run(args.algorithm, args.epsilon, args.seed, args.clients, args.iterations)
    report(summary_lines(result), result, args.out, log)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The run in three lines: what ran, its metric beside the references, each client's ε."""
    name = result["metric_name"]
    where = f"across {result['clients']} Flower clients" if result["clients"] > 1 else "centralized"
    source = "each node's ledger" if result["clients"] > 1 else "ledger"
    references = ", ".join(f"{label} {metric_text(name, result[key])}" for label, key in
                           (("non-private", "nonprivate_metric"), ("diffprivlib", "diffprivlib_metric")))
    return [
        f"{result['algorithm']} on {ALGORITHMS[result['algorithm']]}, ε = {result['epsilon']:g} per record, {where}",
        f"{name.replace('_', ' ')}: {metric_text(name, result['metric'])} ({references})",
        epsilon_line(result["client_epsilon"], DELTA, source),
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
