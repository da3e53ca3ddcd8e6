"""User-level accounting against independent references: the round's event against
dp-accounting, the quantile estimate's share of the noise against Andrew et al. (2021)'s
formula, and over random populations, cohorts, budgets and absences, no client of the
population ledger past its budget while every affordable client is booked every round."""

import functools
import logging

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import Budget, GaussianEvent, SelfComposedEvent, calibrate_noise_multiplier, epsilon_of
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.userlevel import delta_noise_multiplier, participant_event, user_round_event
from fedpriv.training import default_plan
from server.assign import Assignment
from server.booking import BudgetExhausted
from server.ledger import ServerLedger
from server.mechanism import Booking
from server.userlevel import UserLevel

DELTA = 1e-5


def _dpa_epsilon(q: float, z: float, rounds: int, prior: tuple[float, ...] = (), accountant=None) -> float:
    """ε of ``rounds`` user-level rounds (and unsampled Gaussians of multipliers ``prior``), by dp-accounting."""
    acc = accountant or RdpAccountant(orders=list(ORDERS))
    for s in prior:
        acc.compose(dp_accounting.GaussianDpEvent(s))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize(("q", "z", "rounds"), [(0.1, 1.3, 100), (0.01, 0.8, 1000), (1.0, 5.0, 10)])
def test_the_user_level_round_is_dp_accountings_poisson_sampled_gaussian(q, z, rounds):
    event = SelfComposedEvent(user_round_event(q, z), rounds)
    assert epsilon_of(event, DELTA, "rdp") == pytest.approx(_dpa_epsilon(q, z, rounds), rel=1e-9)
    pld = PLDAccountant(value_discretization_interval=1e-4)
    assert epsilon_of(event, DELTA, "pld") == pytest.approx(_dpa_epsilon(q, z, rounds, accountant=pld), rel=1e-3)


def test_a_calibrated_user_level_z_is_the_smallest_three_digit_one_meeting_the_target():
    q, rounds, target = 100 / 1000, 100, 5.0
    z = calibrate_noise_multiplier(target, DELTA, q, rounds)
    assert _dpa_epsilon(q, z, rounds) <= target < _dpa_epsilon(q, round(z - 0.01, 2), rounds)


@pytest.mark.parametrize(("z", "count_noise"), [(1.0, 5.0), (1.3, 0.7), (0.5, 10.0)])
def test_the_quantile_estimate_takes_andrew_et_als_share_and_the_round_stays_one_gaussian(z, count_noise):
    z_delta = delta_noise_multiplier(z, count_noise)
    assert z_delta == pytest.approx((z**-2 - (2 * count_noise) ** -2) ** -0.5, rel=1e-12)
    assert z_delta > z  # the count takes a share: the delta sum needs more noise than z
    # the delta sum (sensitivity 1 in units of S) and the centred count (sensitivity 1/2, noise σ_b)
    together, alone = RdpAccountant(orders=list(ORDERS)), RdpAccountant(orders=list(ORDERS))
    together.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_delta),
                                                    dp_accounting.GaussianDpEvent(count_noise / 0.5)]))
    alone.compose(dp_accounting.GaussianDpEvent(z))
    np.testing.assert_allclose(together._rdp, alone._rdp, rtol=1e-9)


def test_a_count_noise_that_would_spend_the_whole_round_is_refused():
    with pytest.raises(ValueError, match="clip-count-noise"):
        delta_noise_multiplier(1.0, 0.5)


def test_a_participant_books_the_gaussian_of_sensitivity_two_s():
    """One record moves a clipped delta anywhere in the S-ball (by ≤ 2S) and the bit by 1:
    noise zS on sensitivity 2S and σ_b on 1 (with z⁻² = z_Δ⁻² + (2σ_b)⁻²) is Gaussian(z/2)."""
    z, count_noise = 1.2, 3.0
    z_delta = delta_noise_multiplier(z, count_noise)
    record_level = RdpAccountant(orders=list(ORDERS))
    record_level.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_delta / 2),
                                                        dp_accounting.GaussianDpEvent(count_noise)]))
    assert epsilon_of(participant_event(z), DELTA) == pytest.approx(record_level.get_epsilon(DELTA), rel=1e-9)


@functools.cache
def _dpa_curve(event: dp_accounting.DpEvent) -> np.ndarray:
    acc = RdpAccountant(orders=list(ORDERS))
    logging.getLogger("absl").setLevel(logging.ERROR)  # its skipped orders are +inf: only ever larger ε
    acc.compose(event)
    return np.asarray(acc._rdp)


def _dpa_rounds_epsilon(q: float, z: float, rounds: int, prior: tuple[float, ...]) -> float:
    """``_dpa_epsilon`` from dp-accounting's curves, each computed once."""
    rdp = rounds * _dpa_curve(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    rdp = rdp + sum((_dpa_curve(dp_accounting.GaussianDpEvent(s)) for s in prior), np.zeros(len(ORDERS)))
    return compute_epsilon(list(ORDERS), rdp, DELTA)[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(population=st.integers(1, 6), data=st.data(), z=st.sampled_from([0.8, 1.5, 3.0]),
       budget=st.sampled_from([2.0, 5.0, 10.0]), seed=st.integers(0, 2**31), rounds=st.integers(1, 8))
def test_over_random_cohorts_no_client_passes_its_budget_and_every_affordable_one_is_booked(
        population, data, z, budget, seed, rounds):
    cohort = data.draw(st.integers(1, population), label="cohort")
    prior = {c: data.draw(st.sampled_from([(), (4.0,), (8.0, 8.0)]), label=f"prior {c}") for c in range(population)}
    ledger = ServerLedger(Budget(budget, DELTA))
    with ledger.transaction() as book:
        for c, sigmas in prior.items():
            if sigmas:
                book.record(str(c), "release/num-examples", tuple(GaussianEvent(s) for s in sigmas))
    plan = default_plan("mnist").non_private()
    nodes = {100 + c: Assignment(str(c), 60, plan, 60.0) for c in range(population)}
    config = {"privacy": "user", "cohort": cohort, "noise-multiplier": z, "seed": seed, "server-randomness": "seeded"}
    mechanism = UserLevel(RunSettings.from_run_config(config), nodes, seed=seed)
    q = cohort / population
    ran = 0
    for r in range(1, rounds + 1):
        online = {n for n in nodes if data.draw(st.booleans(), label=f"online {n} {r}")}
        try:
            with ledger.transaction() as book:
                sampled = mechanism.book(Booking(book, nodes, protocol.train_entry("run-x", r), r, frozenset(online)))
        except BudgetExhausted:
            break
        ran = r
        assert set(sampled) <= online
    spent = ledger.snapshot()
    for c in range(population):
        booked = len(spent.entries(str(c))) - bool(prior[c])
        affordable = 0
        while affordable < ran and _dpa_rounds_epsilon(q, z, affordable + 1, prior[c]) <= budget:
            affordable += 1
        assert booked == affordable, f"client {c}: booked {booked} rounds, affords {affordable} of {ran}"
        if booked:
            assert _dpa_rounds_epsilon(q, z, booked, prior[c]) <= budget
