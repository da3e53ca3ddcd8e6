"""``accuracy.png`` and ``epsilon.png`` from a federated run's ``results.json``.

- ``accuracy.png``: central test accuracy (%) after each round, from round 1, the final
  value marked and written next to it; the initial model's accuracy is in the title.
- ``epsilon.png``: each client's ε (the server ledger's) after each round, with the
  per-client budget as a dashed line and the accountant and δ in the title. Clients whose
  curves are identical are drawn once ("clients 0–9 (identical)"); beyond
  ``MAX_CLIENT_CURVES`` distinct curves, the min–max and interquartile bands over clients
  and the median.

A run without rounds gets figures that say so. Axes end at the last round, integer ticks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from server.history import client_order  # noqa: E402

MAX_CLIENT_CURVES = 10
"""More distinct ε curves than this are drawn as bands (min–max, interquartile) and the median."""

MARKERS_UP_TO = 40
"""Rounds are marked as points up to this many rounds; beyond, only the line."""

FIGSIZE = (6.0, 3.8)
DPI = 150
ACCOUNTANTS = {"rdp": "RDP", "pld": "PLD", "zcdp": "zCDP", "advanced": "advanced composition",
               "basic": "basic composition"}


def plot_results(results: dict[str, Any], out: Path) -> None:
    """Write ``out/accuracy.png`` and ``out/epsilon.png``."""
    for name, draw in (("accuracy.png", accuracy_figure), ("epsilon.png", epsilon_figure)):
        fig = draw(results)
        fig.savefig(out / name, dpi=DPI)
        plt.close(fig)


def accuracy_figure(results: dict[str, Any]) -> Figure:
    """Test accuracy in % by round (from round 1), the final value marked and annotated."""
    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    initial = results.get("initial", {}).get("test_accuracy")
    title = "Test accuracy of the global model"
    if initial is not None:
        title += f"\n(initial model: {100 * initial:.1f} %)"
    ax.set_title(title, fontsize=10)
    points = [(r["round"], 100 * r["test_accuracy"]) for r in results["rounds"] if r.get("test_accuracy") is not None]
    if not points:
        _no_rounds(ax, results)
        return fig
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, marker="o" if len(xs) <= MARKERS_UP_TO else "", markersize=4, color="C0")
    ax.plot(xs[-1], ys[-1], marker="o", markersize=8, color="C3", zorder=3)
    rising = len(ys) == 1 or ys[-1] >= ys[-2]  # write the value where the line does not come from
    ax.annotate(f"{ys[-1]:.2f} %", (xs[-1], ys[-1]), xytext=(-6, 8 if rising else -8), textcoords="offset points",
                ha="right", va="bottom" if rising else "top", fontsize=9, color="C3")
    low, high = min(ys), max(ys)
    span = max(high - low, 5.0)
    ax.set_ylim(max(0.0, low - 0.15 * span), min(100.0, high + 0.15 * span) if high < 100 else 100.5)
    ax.set(xlabel="round", ylabel="test accuracy (%)")
    ax.grid(alpha=0.3)
    _round_axis(ax, xs[0], xs[-1])
    return fig


def epsilon_figure(results: dict[str, Any]) -> Figure:
    """Each client's ε by round, the budget line, identical curves drawn once; a band when many."""
    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    resolved = results.get("resolved") or {}
    settings = results.get("settings") or {}
    delta = resolved.get("delta", settings.get("delta"))
    accountant = resolved.get("accountant")
    how = ", ".join(part for part in (
        f"{ACCOUNTANTS.get(accountant, accountant)} accountant" if accountant else "",
        f"δ = {_number(delta)}" if delta is not None else "") if part)
    ax.set_title("Privacy spent per client" + (f"\n({how})" if how else ""), fontsize=10)
    rounds = [r["round"] for r in results["rounds"]]
    if not rounds:
        _no_rounds(ax, results)
        return fig
    clients = sorted({c for r in results["rounds"] for c in r["epsilon"]} | set(results.get("final_epsilon", {})),
                     key=client_order)
    series = {c: tuple(_finite(r["epsilon"].get(c)) for r in results["rounds"]) for c in clients}
    groups: dict[tuple[float, ...], list[str]] = {}
    for c, eps in series.items():
        groups.setdefault(tuple(-1.0 if math.isnan(e) else e for e in eps), []).append(c)
    if len(groups) <= MAX_CLIENT_CURVES:
        for ids in groups.values():
            eps = series[ids[0]]
            last = next((e for e in reversed(eps) if not math.isnan(e)), math.nan)
            ax.plot(rounds, eps, marker="o" if len(rounds) <= MARKERS_UP_TO else "", markersize=3,
                    label=f"{client_label(ids)}: final ε = {last:.4g}")
    else:
        columns = [[eps[i] for eps in series.values() if not math.isnan(eps[i])] for i in range(len(rounds))]
        low, q1, mid, q3, high = (list(row) for row in zip(*(
            np.percentile(col, [0, 25, 50, 75, 100]) if col else [math.nan] * 5 for col in columns), strict=True))
        unsampled = " (0: not sampled yet)" if low[-1] == 0 else ""
        ax.fill_between(rounds, low, high, alpha=0.18, color="C0", linewidth=0,
                        label=f"min–max over {len(clients)} clients{unsampled}")
        ax.fill_between(rounds, q1, q3, alpha=0.35, color="C0", linewidth=0, label="25–75th percentile")
        ax.plot(rounds, mid, marker="o" if len(rounds) <= MARKERS_UP_TO else "", markersize=3, color="C0",
                label=f"median (final: {mid[-1]:.4g}; max {high[-1]:.4g})")
    budget = settings.get("epsilon_budget") or settings.get("target_epsilon")
    top = max((e for eps in series.values() for e in eps if not math.isnan(e)), default=1.0)
    if budget:
        ax.axhline(float(budget), color="C3", linestyle="--", linewidth=1.2, label=f"budget ε = {_number(budget)}")
        top = max(top, float(budget))
    ax.set_ylim(0, 1.12 * top)
    ax.set(xlabel="round", ylabel="ε")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    _round_axis(ax, rounds[0], rounds[-1])
    return fig


def client_label(ids: list[str]) -> str:
    """"client 3", "clients 0–9 (identical)", "clients 0, 2, 5 (identical)", "12 clients (identical)"."""
    if len(ids) == 1:
        return f"client {ids[0]}"
    if all(c.isascii() and c.isdigit() for c in ids):
        ranges = _ranges(sorted(int(c) for c in ids))
        names = ", ".join(f"{a}–{b}" if b > a + 1 else (f"{a}, {b}" if b == a + 1 else f"{a}") for a, b in ranges)
    else:
        names = ", ".join(ids)
    return f"clients {names} (identical)" if len(names) <= 24 else f"{len(ids)} clients (identical)"


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted integers as (first, last)."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def _round_axis(ax: Axes, first: int, last: int) -> None:
    """Integer round ticks, the axis ending at the last round (room for the markers only)."""
    if last - first <= 10:
        ax.set_xticks(range(first, last + 1))
    else:  # round ticks, the first and last round among them
        inner = [int(t) for t in MaxNLocator(nbins=8, integer=True).tick_values(first, last)]
        step = inner[1] - inner[0]
        ax.set_xticks([first, *(t for t in inner if t - first >= step / 2 and last - t >= step / 2), last])
    pad = 0.3 if last == first else 0.03 * (last - first)
    ax.set_xlim(first - pad, last + pad)


def _no_rounds(ax: Axes, results: dict[str, Any]) -> None:
    """The figure of a run that trained no round."""
    reason = results.get("stopped")
    ax.text(0.5, 0.5, "no round ran" + (f"\n{reason}" if reason else ""), ha="center", va="center",
            transform=ax.transAxes, fontsize=10, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _finite(value: Any) -> float:
    """ε as a float; missing (a client not known yet) or ∞ (not private) as NaN: a gap."""
    if value is None:
        return math.nan
    value = float(value)
    return value if math.isfinite(value) else math.nan


def _number(value: Any) -> str:
    """1e-05 as 10⁻⁵ (mathtext), other numbers as %g."""
    value = float(value)
    exponent = math.log10(value) if value > 0 else 0.5
    if exponent == int(exponent) and abs(exponent) >= 3:
        return f"$10^{{{int(exponent)}}}$"
    return f"{value:g}"

