"""``simulations._plots`` on hand-made results: what the axes hold (lines, labels, the budget
line, the band), not pixels."""

import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PolyCollection

from simulations._plots import accuracy_figure, client_label, epsilon_figure, plot_results


def _results(epsilons, budget=None, target=None, accuracies=None, stopped=None):
    """``epsilons``: client id -> ε after each round (None: not known yet that round)."""
    rounds = len(next(iter(epsilons.values()), []))
    accuracies = accuracies or [0.5 + 0.1 * r for r in range(rounds)]
    return {
        "settings": {"delta": 1e-5, "epsilon_budget": budget, "target_epsilon": target},
        "resolved": {"accountant": "rdp", "delta": 1e-5},
        "initial": {"test_accuracy": 0.1, "test_loss": 2.3},
        "rounds": [{"round": r + 1, "test_accuracy": accuracies[r],
                    "epsilon": {c: eps[r] for c, eps in epsilons.items() if eps[r] is not None}}
                   for r in range(rounds)],
        "final_epsilon": {c: eps[-1] for c, eps in epsilons.items()} if rounds else {},
        "stopped": stopped,
    }


def _curves(ax):
    """label -> y data of the plotted lines, the budget line left out."""
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()
            if not line.get_label().startswith("budget")}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_identical_clients_are_one_line_labelled_so():
    same = [1.0, 1.5, 2.0]
    fig = epsilon_figure(_results({str(c): same for c in range(10)} | {"10": [0.5, 0.5, 1.0]}))
    ax = fig.axes[0]
    curves = _curves(ax)
    assert len(curves) == 2
    label = next(k for k in curves if k.startswith("clients"))
    assert label.startswith("clients 0–9 (identical)") and curves[label] == same
    assert any(k.startswith("client 10:") for k in curves)
    assert "RDP accountant" in ax.get_title() and "10^{-5}" in ax.get_title()


def test_many_distinct_clients_are_a_band_with_the_median():
    epsilons = {str(c): [0.1 * c, 0.2 * c] for c in range(1, 16)}
    ax = epsilon_figure(_results(epsilons)).axes[0]
    bands = {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}
    assert list(bands) == ["min–max over 15 clients", "25–75th percentile"]
    (label, median), = _curves(ax).items()  # no line per client
    assert label.startswith("median") and median == pytest.approx([0.8, 1.6])
    low, high = bands["min–max over 15 clients"].get_paths()[0].vertices[:, 1].min(), \
        bands["min–max over 15 clients"].get_paths()[0].vertices[:, 1].max()
    assert (low, high) == pytest.approx((0.1, 3.0))


def test_the_budget_line_is_the_server_budget_else_the_target():
    epsilons = {"0": [1.0, 2.0], "1": [0.5, 1.0]}
    for budget, target, expected in ((3.0, 2.0, 3.0), (None, 2.0, 2.0)):
        ax = epsilon_figure(_results(epsilons, budget=budget, target=target)).axes[0]
        (line,) = [line for line in ax.get_lines() if line.get_label().startswith("budget")]
        assert set(line.get_ydata()) == {expected}
    ax = epsilon_figure(_results(epsilons)).axes[0]
    assert not [line for line in ax.get_lines() if line.get_label().startswith("budget")]


def test_accuracy_in_percent_from_round_one_with_the_final_value_annotated():
    ax = accuracy_figure(_results({"0": [1.0, 2.0, 3.0]}, accuracies=[0.9, 0.95, 0.9607])).axes[0]
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3]
    assert list(line.get_ydata()) == pytest.approx([90.0, 95.0, 96.07])
    assert [t.get_text() for t in ax.texts] == ["96.07 %"]
    assert "10.0 %" in ax.get_title()  # the initial model
    assert ax.get_xlim()[1] < 3.5 and all(float(t).is_integer() for t in ax.get_xticks())


def test_a_late_client_is_a_gap_not_a_zero():
    ax = epsilon_figure(_results({"0": [1.0, 2.0, 3.0], "1": [None, 1.0, 2.0]})).axes[0]
    late = _curves(ax)["client 1: final ε = 2"]
    assert math.isnan(late[0]) and late[1:] == [1.0, 2.0]


def test_zero_rounds_write_figures_that_say_so(tmp_path):
    results = _results({}, stopped="round 1: no client can afford another round")
    plot_results(results, tmp_path)
    assert (tmp_path / "accuracy.png").stat().st_size > 0 and (tmp_path / "epsilon.png").stat().st_size > 0
    for figure in (accuracy_figure, epsilon_figure):
        (text,) = figure(results).axes[0].texts
        assert "no round ran" in text.get_text() and "no client can afford" in text.get_text()


@pytest.mark.parametrize("ids, label", [
    (["3"], "client 3"),
    (["0", "1", "2", "3"], "clients 0–3 (identical)"),
    (["0", "1", "5"], "clients 0, 1, 5 (identical)"),
    (["1", "4", "9", "12", "17", "19", "23", "25"], "8 clients (identical)"),
])
def test_client_labels(ids, label):
    assert client_label(ids) == label
