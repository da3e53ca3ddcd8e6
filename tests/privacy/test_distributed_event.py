"""The distributed discrete Gaussian event and its accounting, against independent references:
dp-accounting's Gaussian (one share, a fine lattice, the factor-1 expansion), Kairouz, Liu &
Steinke's closed form and Zhu & Wang's bound recomputed here in plain Python."""

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant as DpaRdp

from fedpriv.privacy import (
    Budget,
    ComposedEvent,
    DistributedDiscreteGaussianEvent,
    GaussianEvent,
    PoissonSampledEvent,
    PrivacyLedger,
    SelfComposedEvent,
    UnsupportedEventError,
    calibrate_distributed_noise,
    calibrate_noise_multiplier,
    distributed_dpsgd_event,
    dpsgd_event,
    epsilon_of,
    event_from_dict,
    event_to_dict,
    make_accountant,
)
from fedpriv.privacy.accountants.distributed import poisson_subsampled_rdp, unsampled_rdp
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.calibration import round_up_3, unit_3
from fedpriv.privacy.events import MIN_SHARE_STDDEV, EventError, NoDpAccountingFormError, to_dp_accounting

INTEGER_ORDERS = [a for a in ORDERS if a == int(a)]


def dpa_rdp(event: dp_accounting.DpEvent, orders) -> np.ndarray:
    backend = DpaRdp(orders=list(orders))
    backend.compose(event)
    return np.array(backend._rdp, dtype=float)


def ours(event, orders=ORDERS) -> np.ndarray:
    """fedpriv's RDP accountant's curve for ``event`` at ``orders`` (a subset of its grid)."""
    acc = make_accountant("rdp").compose(event)
    by_order = dict(zip(acc.orders.tolist(), acc.rdp.tolist()))
    return np.array([by_order[a] for a in orders])


def kls_reference(s: float, n: int, sens: float, d: int, alpha: float) -> float:
    """Kairouz et al.'s simplified bound, from the formula, term by term."""
    tau = 10 * sum(math.exp(-2 * math.pi**2 * s**2 * k / (k + 1)) for k in range(1, n))
    scale = sens / (math.sqrt(n) * s)
    return min(alpha * scale**2 / 2 + tau * d, alpha / 2 * (scale + math.sqrt(d) * tau) ** 2)


def zhu_wang_reference(eps, q: float, alpha: int, factor: float = 3.0) -> float:
    """Zhu & Wang's Theorem 5 at integer alpha, in plain floats (small alpha only)."""
    total = (1 - q) ** (alpha - 1) * (alpha * q - q + 1)
    total += math.comb(alpha, 2) * q**2 * (1 - q) ** (alpha - 2) * math.exp(eps(2))
    total += factor * sum(math.comb(alpha, j) * (1 - q) ** (alpha - j) * q**j * math.exp((j - 1) * eps(j))
                          for j in range(3, alpha + 1))
    return math.log(total) / (alpha - 1)


# --- unsampled ---------------------------------------------------------------------

@pytest.mark.parametrize("s, sens", [(3.0, 2.0), (0.3, 1.0), (40.0, 17.0)])
def test_one_share_is_the_discrete_gaussian_whose_rdp_is_the_gaussians(s, sens):
    event = DistributedDiscreteGaussianEvent(s, 1, sens, 10_000)
    gaussian = dp_accounting.GaussianDpEvent(s / sens)
    np.testing.assert_allclose(ours(event, INTEGER_ORDERS), dpa_rdp(gaussian, INTEGER_ORDERS), rtol=1e-12)
    reference = DpaRdp(orders=list(ORDERS))
    reference.compose(dp_accounting.SelfComposedDpEvent(gaussian, 7))
    assert epsilon_of(SelfComposedEvent(event, 7), 1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


@pytest.mark.parametrize("s", [2.0, 5.0, 10.0])
def test_a_fine_lattice_tends_to_the_gaussian_of_the_summed_noise(s):
    n, d = 10, 1_000_000
    sens = math.sqrt(n) * s / 1.3  # σ = √n·s/Δ₂ = 1.3
    event = DistributedDiscreteGaussianEvent(s, n, sens, d)
    gaussian = dpa_rdp(dp_accounting.GaussianDpEvent(1.3), ORDERS)
    got = ours(event)
    assert np.all(got >= gaussian * (1 - 1e-12))  # never below the Gaussian
    np.testing.assert_allclose(got, gaussian, rtol={2.0: 1e-8, 5.0: 1e-12, 10.0: 1e-12}[s])


@pytest.mark.parametrize("s, n, sens, d", [(1.0, 10, 3.0, 100), (0.6, 10, 8.0, 10), (0.5, 3, 5.0, 50)])
def test_a_coarse_lattice_pays_kairouz_liu_steinke_tau(s, n, sens, d):
    event = DistributedDiscreteGaussianEvent(s, n, sens, d)
    reference = np.array([kls_reference(s, n, sens, d, a) for a in ORDERS])
    np.testing.assert_allclose(ours(event), reference, rtol=1e-12)
    gaussian = dpa_rdp(dp_accounting.GaussianDpEvent(math.sqrt(n) * s / sens), ORDERS)
    assert np.all(reference > gaussian)  # τ > 0 costs something at every order


def test_both_forms_of_the_min_are_taken():
    s, n, sens, d = 1.0, 10, 3.0, 100
    tau = 10 * sum(math.exp(-2 * math.pi**2 * s**2 * k / (k + 1)) for k in range(1, n))
    scale = sens / (math.sqrt(n) * s)
    got = dict(zip(ORDERS, ours(DistributedDiscreteGaussianEvent(s, n, sens, d))))
    assert got[2.0] == pytest.approx(2 / 2 * (scale + math.sqrt(d) * tau) ** 2, rel=1e-12)
    assert got[64.0] == pytest.approx(64 * scale**2 / 2 + tau * d, rel=1e-12)


def test_zcdp_charges_rho_of_the_second_form_and_the_gaussians_for_one_share():
    s, n, sens, d = 1.0, 10, 3.0, 100
    tau = 10 * sum(math.exp(-2 * math.pi**2 * s**2 * k / (k + 1)) for k in range(1, n))
    rho = (sens / (math.sqrt(n) * s) + math.sqrt(d) * tau) ** 2 / 2
    event = DistributedDiscreteGaussianEvent(s, n, sens, d)
    assert make_accountant("zcdp").compose(SelfComposedEvent(event, 5)).rho == pytest.approx(5 * rho, rel=1e-12)
    # sampled: no amplification in zcdp (its rule for every mechanism)
    sampled = distributed_dpsgd_event(s, n, sens, d, 0.1, 5)
    assert make_accountant("zcdp").compose(sampled).rho == pytest.approx(5 * rho, rel=1e-12)
    one = DistributedDiscreteGaussianEvent(4.0, 1, 2.0, 7)
    assert make_accountant("zcdp").compose(one).rho == pytest.approx(1 / (2 * 2.0**2), rel=1e-12)


# --- Poisson subsampled ------------------------------------------------------------

@pytest.mark.parametrize("q", [0.01, 4096 / 60000, 0.3])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_the_subsampled_bound_never_undercuts_the_tight_gaussian(q, sigma):
    for event in (DistributedDiscreteGaussianEvent(3.0 * sigma, 1, 3.0, 1000),   # one share: exactly a DG
                  DistributedDiscreteGaussianEvent(50.0, 10, math.sqrt(10) * 50.0 / sigma, 10**6)):
        # Integer orders only: there dp-accounting's value is the exact Rényi divergence; at
        # fractional orders it is itself an upper bound (near α = 1 and large q even above its
        # value at α = 2), so it is no reference for soundness.
        tight = dpa_rdp(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                        INTEGER_ORDERS)
        got = ours(PoissonSampledEvent(q, event), INTEGER_ORDERS)
        assert np.all(got >= tight * (1 - 1e-12))


@pytest.mark.parametrize("q", [0.05, 0.9])  # 0.9: the unsampled bound is the smaller one at some orders
def test_the_subsampled_bound_is_zhu_wangs_theorem_5_recomputed(q):
    m = DistributedDiscreteGaussianEvent(1.0, 10, 3.0, 100)

    def eps(alpha):
        return kls_reference(1.0, 10, 3.0, 100, alpha)

    got = dict(zip(ORDERS, ours(PoissonSampledEvent(q, m))))
    for alpha in [a for a in ORDERS if a <= 30]:
        ceiling = max(2, math.ceil(alpha))  # RDP is non-decreasing in α: the bound at ⌈α⌉ holds at α
        expected = min(zhu_wang_reference(eps, q, ceiling), eps(alpha))
        assert got[alpha] == pytest.approx(expected, rel=1e-10), alpha


def test_the_expansion_with_factor_one_is_dp_accountings_sampled_gaussian():
    """Zhu & Wang's Theorem 5 with factor 1 on the ℓ ≥ 3 terms is Mironov et al.'s exact
    sampled-Gaussian sum: an independent check of the binomial expansion."""
    orders = np.array(INTEGER_ORDERS)
    for sigma, q in [(0.8, 0.3), (1.0, 4096 / 60000), (4.0, 0.01)]:
        curve = unsampled_rdp(DistributedDiscreteGaussianEvent(2.0 * sigma, 1, 2.0, 1))
        got = poisson_subsampled_rdp(curve, q, orders, higher_order_factor=1.0)
        tight = dpa_rdp(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), orders)
        np.testing.assert_allclose(got, tight, rtol=1e-9)


def test_sample_rate_one_is_the_unsampled_gaussian():
    event = distributed_dpsgd_event(2.0, 1, 1.0, 10, 1.0, 30)
    reference = DpaRdp(orders=list(ORDERS))
    reference.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 30))
    np.testing.assert_allclose(make_accountant("rdp").compose(event).rdp, reference._rdp, rtol=1e-12)
    assert epsilon_of(event, 1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


def test_distributed_dpsgd_epsilon_is_finite_and_above_the_gaussians():
    q, steps, n, s = 4096 / 60000, 440, 10, 64.0
    for sigma in (1.0, 2.0, 4.0):
        event = distributed_dpsgd_event(s, n, math.sqrt(n) * s / sigma, 100_000, q, steps)
        tight = epsilon_of(dpsgd_event(sigma, q, steps), 1e-5)
        assert tight <= epsilon_of(event, 1e-5) < math.inf


# --- the accountants that cannot -----------------------------------------------------

@pytest.mark.parametrize("kind", ["pld", "advanced", "basic"])
def test_accountants_without_a_sound_form_refuse_it_and_keep_their_state(kind):
    acc = make_accountant(kind).compose(dpsgd_event(2.0, 0.05, 50))
    before = acc.epsilon(1e-5)
    mixed = ComposedEvent((GaussianEvent(3.0), distributed_dpsgd_event(4.0, 3, 2.0, 10, 0.05, 5)))
    with pytest.raises(UnsupportedEventError, match=kind):
        acc.compose(mixed)
    assert acc.epsilon(1e-5) == before


def test_dp_accounting_has_no_form_for_it():
    with pytest.raises(NoDpAccountingFormError, match="dp-accounting has no distributed discrete Gaussian"):
        to_dp_accounting(distributed_dpsgd_event(4.0, 3, 2.0, 10, 0.05, 5))


# --- the event, its JSON, the ledger ---------------------------------------------------

def test_json_round_trip_nested():
    event = ComposedEvent((dpsgd_event(1.1, 0.01, 3), distributed_dpsgd_event(12.5, 7, 300.0, 1234, 0.02, 9)))
    data = json.loads(json.dumps(event_to_dict(event)))
    assert data["events"][1]["event"]["event"] == {"type": "distributed_discrete_gaussian", "noise_stddev": 12.5,
                                                   "shares": 7, "sensitivity": 300.0, "dimension": 1234}
    assert event_from_dict(data) == event


GOOD = {"type": "distributed_discrete_gaussian", "noise_stddev": 2.0, "shares": 3, "sensitivity": 5.0,
        "dimension": 10}


@pytest.mark.parametrize("change", [
    {"noise_stddev": 0}, {"noise_stddev": -1.0}, {"noise_stddev": "2"}, {"noise_stddev": float("nan")},
    {"noise_stddev": float("inf")}, {"noise_stddev": 0.3},  # < 1/2 with 3 shares: outside Theorem 1
    {"shares": 0}, {"shares": 1.5}, {"shares": True}, {"shares": "3"},
    {"sensitivity": 0.0}, {"sensitivity": -2.0}, {"sensitivity": None}, {"sensitivity": float("inf")},
    {"dimension": 0}, {"dimension": 2.0}, {"dimension": None},
    {"dimension": ...},  # missing key
], ids=repr)
def test_malformed_json_is_refused(change):
    data = dict(GOOD)
    for key, value in change.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    with pytest.raises(EventError):
        event_from_dict(data)
    assert event_from_dict(GOOD) == DistributedDiscreteGaussianEvent(2.0, 3, 5.0, 10)


def test_one_share_may_be_finer_than_one_half():
    assert DistributedDiscreteGaussianEvent(0.3, 1, 1.0, 1).noise_multiplier == pytest.approx(0.3)


def test_distributed_dpsgd_event_refuses_a_rate_the_samplers_cannot_draw():
    with pytest.raises(EventError, match="sample_rate"):
        distributed_dpsgd_event(2.0, 3, 5.0, 10, 1e-12, 5)


def test_a_ledger_composes_local_and_distributed_events_and_persists_them(tmp_path):
    """One share with q = 1 is exactly a Gaussian of σ = s/Δ₂: dp-accounting composes the
    same mix as a reference."""
    ledger = PrivacyLedger(Budget(20.0, 1e-5), "rdp")
    local, distributed = dpsgd_event(1.1, 0.01, 600), distributed_dpsgd_event(6.0, 1, 2.0, 100, 1.0, 4)
    ledger.record("node", "run/round-1/train", [local])
    for r in (2, 3):
        ledger.record("node", f"run/round-{r}/train", [distributed])
    reference = DpaRdp(orders=list(ORDERS))
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 600)
    reference.compose(dp_accounting.GaussianDpEvent(3.0), 8)
    assert ledger.spent("node") == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)
    path = tmp_path / "ledger.json"
    ledger.save(path)
    loaded = PrivacyLedger.load(path)
    assert loaded == ledger and loaded.events("node") == (local, distributed, distributed)
    assert loaded.spent("node") == ledger.spent("node")


# --- calibration -----------------------------------------------------------------------

def test_calibrated_share_meets_the_target_and_one_unit_less_does_not():
    q, steps, n, sens, d = 4096 / 60000, 440, 10, 300.0, 100_000
    s = calibrate_distributed_noise(4.0, 1e-5, q, steps, n, sens, d)
    assert epsilon_of(distributed_dpsgd_event(s, n, sens, d, q, steps), 1e-5) <= 4.0
    assert epsilon_of(distributed_dpsgd_event(s - unit_3(s), n, sens, d, q, steps), 1e-5) > 4.0
    assert s == round_up_3(s)


def test_one_unsampled_share_calibrates_like_the_gaussian():
    """q = 1, n = 1, Δ₂ = 1: the event is the Gaussian of σ = s, calibrated through dp-accounting."""
    for target in (0.5, 3.0):
        assert calibrate_distributed_noise(target, 1e-5, 1.0, 20, 1, 1.0, 50) == \
            calibrate_noise_multiplier(target, 1e-5, 1.0, 20)


def test_calibration_never_goes_below_one_half_with_several_shares():
    assert calibrate_distributed_noise(50.0, 1e-5, 0.01, 1, 10, 0.1, 10) == MIN_SHARE_STDDEV
    assert calibrate_distributed_noise(50.0, 1e-5, 0.01, 1, 1, 0.1, 10) < MIN_SHARE_STDDEV


@pytest.mark.parametrize("args", [(0, 5.0, 10), (3, 0.0, 10), (3, 5.0, 0)])
def test_calibration_refuses_a_malformed_mechanism(args):
    with pytest.raises(EventError):
        calibrate_distributed_noise(2.0, 1e-5, 0.01, 100, *args)


@pytest.mark.parametrize("s, sens", [(1e-200, 1.0), (1e300, 1e-300)])
def test_extreme_scales_give_infinity_or_zero_never_an_error_or_a_negative_value(s, sens):
    event = distributed_dpsgd_event(s, 1, sens, 10**9, 0.1, 3)
    rdp = make_accountant("rdp").compose(event).rdp
    assert not np.isnan(rdp).any() and (rdp >= 0).all()
    expected = math.inf if s < 1 else 0.0
    assert epsilon_of(event, 1e-5) == expected and epsilon_of(event, 1e-5, "zcdp") == expected
