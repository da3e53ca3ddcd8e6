"""Per-client plans: one shared sample rate by default, σ calibrated against dp-accounting."""

import dp_accounting
import pytest

import fedpriv.training
import server.assign
from fedpriv.federation.protocol import read_plan
from fedpriv.federation.settings import RunSettings
from fedpriv.training import default_plan
from server.assign import Assigner
from server.discovery import ClientInfo

CLIENTS = {10: ClientInfo("0", 30000), 11: ClientInfo("1", 10000), 12: ClientInfo("2", 10000)}


def _assign(settings: RunSettings, clients: dict[int, ClientInfo]):
    return Assigner(settings, clients)(clients)


def _dp_accounting_epsilon(sigma: float, q: float, steps: int) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(1e-5)


def test_default_lot_is_shared_at_the_centralized_rate_and_each_client_meets_the_target() -> None:
    nodes = _assign(RunSettings(rounds=2, target_epsilon=2.0), CLIENTS)
    plans = {node: read_plan(a.config) for node, a in nodes.items()}
    rates = {plans[n].sample_rate(CLIENTS[n].num_examples) for n in plans}
    assert rates == {4096 / 50000}  # expected lots 2457.6, 819.2, 819.2: the lot shared 3:1:1
    assert len({a.events for a in nodes.values()}) == 1  # one event for all
    for node in nodes:
        plan, n = plans[node], CLIENTS[node].num_examples
        eps = _dp_accounting_epsilon(plan.noise_multiplier, plan.sample_rate(n), 2 * plan.steps_per_round(n))
        assert 1.9 < eps <= 2.0 + 1e-9  # calibrated, not just safe


def test_one_client_gets_the_centralized_sample_rate() -> None:
    (assignment,) = _assign(RunSettings(rounds=1, noise_multiplier=1.0), {7: ClientInfo("0", 60000)}).values()
    assert read_plan(assignment.config).sample_rate(60000) == default_plan("mnist").sample_rate(60000)


def test_clients_of_many_sizes_and_late_joiners_need_one_calibration(monkeypatch) -> None:
    calls = []
    calibrate = fedpriv.training.calibrate_plan
    monkeypatch.setattr(server.assign, "calibrate_plan", lambda *a, **k: calls.append(a) or calibrate(*a, **k))
    clients = {node: ClientInfo(str(node), 150 + 37 * node) for node in range(20)}
    assigner = Assigner(RunSettings(rounds=1, target_epsilon=2.0), clients)
    first = assigner(clients)
    (late,) = assigner({99: ClientInfo("99", 5000)}).values()
    assert len(calls) == 1
    assert late.events == first[0].events  # the same q (fixed by the first discovery) and σ


def test_an_explicit_lot_size_is_used_by_every_client() -> None:
    nodes = _assign(RunSettings(rounds=1, lot_size=64, noise_multiplier=1.0), CLIENTS)
    plans = [read_plan(a.config) for a in nodes.values()]
    assert {p.lot_size for p in plans} == {64}
    assert {p.shared_sample_rate for p in plans} == {None}
    with pytest.raises(ValueError):
        RunSettings(rounds=1, lot_size=64, noise_multiplier=1.0, target_epsilon=1.0)
