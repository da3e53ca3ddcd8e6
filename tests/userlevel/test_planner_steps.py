"""The planner's columns say what they count: the distributed column's rounds are DP-SGD
steps (one each), so its table cells and ε rows are read at the same training as local
mode's rounds, and each record-level column gives the DP-SGD steps it affords."""

import re

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.privacy.__main__ import main
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.planner import Federation, plan

DELTA, TARGET, ROUNDS = 1e-5, 5.0, 50
SHAPE = ["--population", "1000", "--cohort", "100", "--rounds", str(ROUNDS), "--records-per-client", "60",
         "--target-epsilon", str(TARGET), "--delta", str(DELTA)]


def _dpa(sigma: float, q: float, steps: int) -> float:
    acc = RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(DELTA)


@pytest.fixture(scope="module")
def result():
    return plan(Federation(population=1000, cohort=100, rounds=ROUNDS, delta=DELTA, sizes=(60,) * 1000,
                           target_epsilon=TARGET))


def test_local_counts_rounds_of_round_one_over_q_steps_and_the_steps_they_afford(result):
    local = result["modes"]["local"]
    q, sigma = local["sample_rate"], local["noise_multiplier"]
    per_round = round(1 / q)  # one epoch of Poisson lots of rate q per round
    assert (local["rounds"], local["steps_per_round"]) == (ROUNDS, per_round)
    rounds = local["rounds_affordable"]
    assert _dpa(sigma, q, rounds * per_round) <= TARGET < _dpa(sigma, q, (rounds + 1) * per_round)
    assert local["steps_affordable"] == rounds * per_round


def test_distributed_counts_its_rounds_of_one_step_each_for_local_modes_training(result):
    local, dist = result["modes"]["local"], result["modes"]["distributed"]
    assert dist["steps_per_round"] == 1 and dist["rounds"] == ROUNDS * local["steps_per_round"] == len(dist["epsilon"])
    assert dist["steps_affordable"] == dist["rounds_affordable"] >= dist["rounds"]
    user = result["modes"]["user"]
    assert (user["rounds"], user["steps_per_round"], user["steps_affordable"]) == (ROUNDS, None, None)


def test_the_table_reads_the_distributed_column_at_local_modes_training_and_names_its_steps(capsys):
    assert main(["plan", "--privacy", "local", "--privacy", "distributed", *SHAPE]) == 0
    rows = {label: cells for label, *cells in (re.split(r"\s{2,}", line) for line in
                                               capsys.readouterr().out.splitlines()[1:])}
    assert rows["DP-SGD steps per round"] == ["15", "1"] and rows["rounds planned"] == ["50", "750"]
    assert rows["DP-SGD steps affordable"][0] == "750"
    local_end, dist_end = map(float, rows["epsilon after round 50 (distributed: 750)"])
    assert local_end <= TARGET and 0.99 * TARGET <= dist_end <= TARGET  # both columns at the end of training
    local_first, dist_first = map(float, rows["epsilon after round 1 (distributed: 15)"])
    assert dist_first == pytest.approx(local_first, rel=0.01)  # one round's 15 steps, σ within 0.2 %


def test_the_printed_user_column_is_dp_accountings_smallest_sigma_and_its_epsilon(capsys):
    """What the sped-up command prints at the issue's shape, recomputed by dp-accounting alone."""
    assert main(["plan", "--privacy", "user", *SHAPE]) == 0
    rows = {label: cells for label, *cells in (re.split(r"\s{2,}", line) for line in
                                               capsys.readouterr().out.splitlines()[1:])}
    sigma, q = float(rows["noise multiplier"][0]), float(rows["sample rate q"][0])
    assert q == 0.1 and _dpa(sigma, q, ROUNDS) <= TARGET < _dpa(sigma - 0.01, q, ROUNDS)
    for r in (1, 12, 24, 36, 48, 50):
        assert rows[f"epsilon after round {r}"] == [f"{_dpa(sigma, q, r):.4g}"]
    assert int(rows["rounds affordable"][0]) == ROUNDS and _dpa(sigma, q, ROUNDS + 1) > TARGET
