"""Calibration's cost in dp-accounting RDP curves (the planner's and every run's σ): the
bracket evaluates σ = unit/2 only when σ = unit already meets the target, and the σ found
is still dp-accounting's smallest 3-digit one."""

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.privacy import calibration
from fedpriv.privacy.accountants import rdp
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.calibration import calibrate_noise_multiplier

DELTA = 1e-5


def _dpa_epsilon(sigma: float, q: float, steps: int) -> float:
    acc = RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(DELTA)


@pytest.fixture
def curves(monkeypatch):
    """The noise multipliers whose RDP curve dp-accounting computes (no cache in between)."""
    seen: list[float] = []
    uncached = rdp.step_rdp.__wrapped__

    def counted(step, orders=ORDERS):
        seen.append(step.mechanism.noise_multiplier)
        return uncached(step, orders)

    monkeypatch.setattr(rdp, "step_rdp", counted)
    calibration._epsilon.cache_clear()
    yield seen
    calibration._epsilon.cache_clear()


@pytest.mark.parametrize(("target", "q", "steps", "expected_curves"), [(5.0, 0.1, 50, 5), (5.0, 0.06827, 750, 5)])
def test_a_sigma_above_one_costs_no_curve_below_one(curves, target, q, steps, expected_curves):
    sigma = calibrate_noise_multiplier(target, DELTA, q, steps)
    assert sigma > 1 and min(curves) == 1.0 and len(curves) == len(set(curves)) == expected_curves
    unit = 10.0 ** (len(str(int(sigma))) - 3)
    assert _dpa_epsilon(sigma, q, steps) <= target < _dpa_epsilon(sigma - unit, q, steps)


def test_a_sigma_below_one_still_brackets_from_one_half(curves):
    sigma = calibrate_noise_multiplier(20.0, DELTA, 0.1, 10)
    assert sigma < 0.5 and curves[:2] == [1.0, 0.5]
    assert _dpa_epsilon(sigma, 0.1, 10) <= 20.0 < _dpa_epsilon(sigma - 0.001, 0.1, 10)
