"""``accuracy.png`` and ``epsilon.png`` from a federated run's ``results.json``."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

MAX_CLIENT_LINES = 20  # beyond this, plot the max / median / min ε instead of every client


def plot_results(results: dict[str, Any], out: Path) -> None:
    """Test accuracy by round, and each client's ε (or its spread) by round."""
    rounds = results["rounds"]
    xs = [0] + [r["round"] for r in rounds]
    acc = [results["initial"].get("test_accuracy")] + [r["test_accuracy"] for r in rounds]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(xs, acc, marker="o")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round", ylabel="test accuracy", title="Global model")
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    clients = sorted(results["final_epsilon"], key=int)
    series = {c: [0.0] + [float(r["epsilon"][c]) for r in rounds] for c in clients}
    if len(clients) <= MAX_CLIENT_LINES:
        for c, eps in series.items():
            ax.plot(xs, eps, marker=".", label=f"client {c}")
        if len(clients) <= 10:
            ax.legend(fontsize=7)
    else:
        columns = list(zip(*series.values()))
        for name, fn in (("max", max), ("median", median), ("min", min)):
            ax.plot(xs, [fn(col) for col in columns], label=f"{name} over clients")
        ax.legend(fontsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round", ylabel=f"ε (δ = {results['settings']['delta']:g})", title="Privacy spent")
    fig.tight_layout()
    fig.savefig(out / "epsilon.png", dpi=120)
    plt.close(fig)

