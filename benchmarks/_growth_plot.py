"""The simulation benchmark's growth curve: three panels against the number of clients
(log axis): seconds per round (simulation and plain loop), seconds to discover the nodes,
and peak memory (PSS) of the driver, of Ray's processes and of both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_growth(points: Sequence[dict[str, Any]], path: Path) -> None:
    """Write the three panels of ``points`` (``benchmarks.simulation`` results) to ``path``."""
    clients = [p["clients"] for p in points]
    fig, (time_ax, discovery_ax, memory_ax) = plt.subplots(1, 3, figsize=(12, 3.8), constrained_layout=True)
    time_ax.plot(clients, [p["simulation_median_s"] for p in points], "o-", label="Flower + Ray simulation")
    time_ax.plot(clients, [p["plain_loop_median_s"] for p in points], "s--", label="plain loop")
    for p in points:
        time_ax.annotate(f"{p['ratio']:.2f}×", (p["clients"], p["simulation_median_s"]),
                         textcoords="offset points", xytext=(4, 6), fontsize=8)
    time_ax.margins(y=0.15)  # room for the ratios
    time_ax.set(ylabel="seconds per round (median)", title="10 % of clients per round" if _tenth(points)
                else "one round")
    discovery_ax.plot(clients, [p["discovery_seconds"] for p in points], "o-")
    discovery_ax.set(ylabel="seconds", title="node discovery (wait + QUERY)")
    for key, label in (("total", "driver + Ray"), ("driver", "driver"), ("ray", "Ray processes")):
        memory_ax.plot(clients, [p["memory_peak_mib"][key] for p in points], "o-", label=label)
    memory_ax.set(ylabel="peak PSS (MiB)", title="memory")
    for ax in (time_ax, discovery_ax, memory_ax):
        ax.set_xscale("log")
        ax.set_xticks(clients, [f"{c:,}" for c in clients])
        ax.minorticks_off()
        ax.set_xlabel("clients")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    time_ax.legend(fontsize=8)
    memory_ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def _tenth(points: Sequence[dict[str, Any]]) -> bool:
    return all(p["clients_per_round"] == max(1, p["clients"] // 10) for p in points)
