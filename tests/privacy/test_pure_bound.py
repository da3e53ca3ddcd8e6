"""A ledger of pure-DP events reports the tighter of its accountant's bound and their basic
composition (issue 37: two releases of ε = 1/2 read 1.006 through RDP), checked against the
closed form (Σ 1/b) and dp-accounting's RDP; any non-pure event leaves the accountant's own."""

import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.privacy import Budget, GaussianEvent, LaplaceEvent, PrivacyLedger, make_accountant
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.events import ComposedEvent, PoissonSampledEvent, SelfComposedEvent

DELTA = 1e-5


def _dp_accounting_rdp(event: dp_accounting.DpEvent) -> float:
    return RdpAccountant(orders=list(ORDERS)).compose(event).get_epsilon(DELTA)


def test_few_pure_releases_cost_their_sum_where_rdp_says_more():
    ledger = PrivacyLedger(Budget(1.0, DELTA))  # the default accountant: rdp
    for i in range(2):
        ledger.record("c", f"half-{i}", (LaplaceEvent(2.0),))  # refused at 1.006 before
    assert _dp_accounting_rdp(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 2)) > 1.003
    assert ledger.spent("c") == 1.0


def test_many_small_pure_releases_cost_rdps_bound_where_it_is_tighter():
    event = SelfComposedEvent(LaplaceEvent(100.0), 400)  # basic: 4.0
    rdp = _dp_accounting_rdp(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(100.0), 400))
    assert rdp < 4.0
    assert make_accountant("rdp").compose(event).epsilon(DELTA) == pytest.approx(rdp, rel=1e-12)


@pytest.mark.parametrize("kind", ["rdp", "zcdp", "pld", "advanced", "basic"])
def test_every_accountant_reports_no_more_than_the_exact_sum_and_delta_zero_from_it(kind):
    accountant = make_accountant(kind).compose(ComposedEvent((LaplaceEvent(3.0), LaplaceEvent(1.5))))
    assert accountant.epsilon(DELTA) <= 1.0  # 1/3 + 2/3
    assert accountant.delta(1.0) == 0.0


def test_a_gaussian_event_leaves_the_accountants_own_bound():
    event = ComposedEvent((LaplaceEvent(2.0), LaplaceEvent(2.0), GaussianEvent(2.0)))
    reference = _dp_accounting_rdp(dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(2.0), dp_accounting.LaplaceDpEvent(2.0), dp_accounting.GaussianDpEvent(2.0)]))
    assert make_accountant("rdp").compose(event).epsilon(DELTA) == pytest.approx(reference, rel=1e-12)


def test_a_sampled_laplace_is_left_to_the_accountant():
    event = ComposedEvent((LaplaceEvent(2.0), PoissonSampledEvent(0.5, LaplaceEvent(2.0))))
    amplified = math.log1p(0.5 * math.expm1(0.5))  # Li, Qardaji & Su: the basic accountant's own
    assert make_accountant("basic").compose(event).epsilon(DELTA) == pytest.approx(0.5 + amplified, rel=1e-12)
