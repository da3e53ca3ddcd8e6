"""The planner's columns say what they count: the distributed column's rounds are a run's
rounds, DP-SGD steps (one each), and each record-level column gives the DP-SGD steps it affords."""

import re

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.planning import Federation, plan
from fedpriv.privacy.__main__ import main
from fedpriv.privacy.accountants.rdp import ORDERS

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


def test_distributed_counts_the_runs_rounds_as_its_dp_sgd_steps_one_each(result):
    """``--rounds`` is what a distributed run reads it as: DP-SGD steps, one a round."""
    dist = result["modes"]["distributed"]
    assert (dist["steps_per_round"], dist["rounds"], len(dist["epsilon"])) == (1, ROUNDS, ROUNDS)
    assert dist["steps_affordable"] == dist["rounds_affordable"] >= dist["rounds"]
    user = result["modes"]["user"]
    assert (user["rounds"], user["steps_per_round"], user["steps_affordable"]) == (ROUNDS, None, None)


def test_the_table_gives_each_columns_steps_per_round_and_the_steps_they_afford(capsys):
    assert main(["plan", "--privacy", "local", "--privacy", "distributed", *SHAPE]) == 0
    rows = {label: cells for label, *cells in (re.split(r"\s{2,}", line) for line in
                                               capsys.readouterr().out.splitlines()[1:])}
    assert rows["DP-SGD steps per round"] == ["15", "1"] and rows["rounds planned"] == ["50", "50"]
    assert rows["DP-SGD steps affordable"][0] == "750"
    local_end, dist_end = map(float, rows["epsilon after round 50"])
    assert local_end <= TARGET and 0.99 * TARGET <= dist_end <= TARGET  # both calibrated for their 50 rounds


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
