"""Hypothesis property tests (small example counts: accountants are not free)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.privacy import (
    Budget,
    BudgetExceededError,
    PrivacyLedger,
    calibrate_noise_multiplier,
    dpsgd_event,
    epsilon_of,
)
from fedpriv.privacy.calibration import round_up_3, unit_3

FAST = settings(max_examples=15, deadline=None)
sigmas = st.floats(0.8, 8.0)
rates = st.floats(0.001, 0.1)
steps = st.integers(1, 2000)


@FAST
@given(sigma=sigmas, q=rates, n=steps, kind=st.sampled_from(["rdp", "zcdp", "basic"]))
def test_epsilon_grows_with_steps_and_rate_and_falls_with_sigma(sigma, q, n, kind):
    eps = epsilon_of(dpsgd_event(sigma, q, n), 1e-5, kind)
    assert epsilon_of(dpsgd_event(sigma, q, 2 * n), 1e-5, kind) >= eps
    assert epsilon_of(dpsgd_event(sigma, min(1.0, 2 * q), n), 1e-5, kind) >= eps
    assert epsilon_of(dpsgd_event(1.5 * sigma, q, n), 1e-5, kind) <= eps


@settings(max_examples=6, deadline=None)
@given(target=st.floats(0.5, 8.0), q=st.floats(0.001, 0.03), n=st.integers(10, 3000),
       kind=st.sampled_from(["rdp", "zcdp"]))
def test_calibration_round_trips(target, q, n, kind):
    sigma = calibrate_noise_multiplier(target, 1e-5, q, n, kind)
    assert round_up_3(sigma) == sigma
    assert epsilon_of(dpsgd_event(sigma, q, n), 1e-5, kind) <= target
    # One unit less in the 3rd significant digit overshoots (σ(1 − 1e-3) may still be
    # above the threshold: a 3-digit unit is 0.1%–1% of σ).
    assert epsilon_of(dpsgd_event(sigma - unit_3(sigma), q, n), 1e-5, kind) > target


@FAST
@given(
    budget=st.floats(0.5, 5.0),
    entries=st.lists(
        st.tuples(st.text(min_size=1, max_size=12), sigmas, st.floats(0.01, 0.1), st.integers(1, 300)),
        min_size=1, max_size=6, unique_by=lambda t: t[0],
    ),
)
def test_ledger_never_records_past_its_budget_and_round_trips(tmp_path_factory, budget, entries):
    ledger = PrivacyLedger(Budget(budget, 1e-5), "zcdp")
    recorded = []
    for key, sigma, q, n in entries:
        try:
            assert ledger.record("c", key, dpsgd_event(sigma, q, n))
            recorded.append(key)
        except BudgetExceededError:
            assert not ledger.has_entry("c", key)
        assert ledger.spent("c") <= budget
    assert list(ledger.entries("c")) == recorded
    path = tmp_path_factory.mktemp("ledger") / "ledger.json"
    ledger.save(path)
    loaded = PrivacyLedger.load(path)
    assert loaded == ledger and list(loaded.entries("c")) == recorded
