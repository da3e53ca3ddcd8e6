"""Per-client plans: shared lots, per-client σ calibrated against dp-accounting."""

import dp_accounting
import pytest

from clients.config import RunSettings
from clients.protocol import read_plan
from server.assign import assign, shared_lot
from server.discovery import ClientInfo

CLIENTS = {10: ClientInfo("0", 30000), 11: ClientInfo("1", 10000), 12: ClientInfo("2", 10000)}


def _dp_accounting_epsilon(sigma: float, q: float, steps: int) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(1e-5)


def test_shared_lot_is_proportional_and_at_least_one() -> None:
    assert shared_lot(4096, 6000, 60000) == 410
    assert shared_lot(4096, 60000, 60000) == 4096  # one client: the centralized lot
    assert shared_lot(100, 1, 60000) == 1


def test_default_lots_share_one_sample_rate_and_each_client_meets_the_target() -> None:
    settings = RunSettings(rounds=2, target_epsilon=2.0)
    nodes = assign(settings, CLIENTS)
    plans = {node: read_plan(a.config) for node, a in nodes.items()}
    assert [plans[n].lot_size for n in (10, 11, 12)] == [2458, 819, 819]  # 4096 shared 3:1:1
    rates = {n: plans[n].sample_rate(CLIENTS[n].num_examples) for n in plans}
    assert max(rates.values()) - min(rates.values()) < 1e-3
    for node, assignment in nodes.items():
        plan, n = plans[node], CLIENTS[node].num_examples
        eps = _dp_accounting_epsilon(plan.noise_multiplier, plan.sample_rate(n), 2 * plan.steps_per_round(n))
        assert eps <= 2.0 + 1e-9
        assert eps > 1.9  # calibrated, not just safe


def test_an_explicit_lot_size_is_used_by_every_client() -> None:
    nodes = assign(RunSettings(rounds=1, lot_size=64, noise_multiplier=1.0), CLIENTS)
    assert {read_plan(a.config).lot_size for a in nodes.values()} == {64}
    with pytest.raises(ValueError):
        RunSettings(rounds=1, lot_size=64, noise_multiplier=1.0, target_epsilon=1.0)
