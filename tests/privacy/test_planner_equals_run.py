"""The plan is the run (issue 37, item 1): in every privacy mode, for every model, with σ given
or calibrated for a target ε, the planner's σ and ε after each round equal what the run's own
setup books, read from ledgers. The run's side is built by the server's code path (``Assigner``,
``server.modes``: the local plans, ``distributed.setup``, the user-level mechanisms) and,
in distributed mode, by the node's (its policy's shares, the lattice read from the round's
config), never by the planner."""

import math
from pathlib import Path
from typing import Any

import pytest

from clients.distributed import read_lattice
from fedpriv.federation import protocol
from fedpriv.federation.policy import NodePolicy
from fedpriv.federation.settings import RunSettings
from fedpriv.model_names import MODELS
from fedpriv.planning import Federation, plan
from fedpriv.privacy import Budget, PrivacyLedger, distributed_dpsgd_event
from server.assign import Assigner
from server.discovery import ClientInfo
from server.modes import Start, mode
from simulations._federated import mode_policy

DELTA, ROUNDS, LOT = 1e-5, 3, 30
SIZES = (20, 23, 17)
MODES = {"local": {"privacy": "local"}, "distributed": {"privacy": "distributed"},
         "user": {"privacy": "user", "cohort": 2, "user-clip": 0.7},
         "user-distributed": {"privacy": "user", "user-noise": "distributed", "cohort": 2, "user-clip": 0.7}}
NOISE = {"sigma": {"noise-multiplier": 0.9}, "target": {"target-epsilon": 4.0}}


def _run_side(config: dict) -> tuple[float, list[float], list[list[float]]]:
    """(σ, ε after each round of the smallest client in the server's ledger, the same in each
    node's ledger where the node books its own event) of the run's setup for ``config``."""
    settings = RunSettings.from_run_config(config)
    clients = {10 + i: ClientInfo(str(i), n) for i, n in enumerate(SIZES)}
    assigner = Assigner(mode(settings).assigned_settings(settings), clients)
    nodes = assigner(clients)
    strategy: Any = mode(settings).mechanism(Start(settings, nodes, assigner.plan))
    smallest = min(nodes.values(), key=lambda a: a.num_examples)
    server, node = PrivacyLedger(Budget(math.inf, DELTA)), PrivacyLedger(Budget(math.inf, DELTA))
    server_eps, node_eps = [], []
    for r in range(1, ROUNDS + 1):
        entry = protocol.train_entry("run-t", r)
        events: tuple[Any, ...]
        if settings.privacy.value == "user":
            events, sigma = (strategy.booked_event(r),), strategy.noise_multiplier
        else:
            events = strategy.charge(smallest, entry).events
            sigma = (strategy.setup.plan if settings.privacy.value == "distributed" else smallest.plan) \
                .noise_multiplier
        server.record(smallest.client_id, entry, events)
        server_eps.append(server.spent(smallest.client_id))
        if settings.privacy.value == "distributed":  # what a simulated node books (clients.distributed.contribute)
            policy = NodePolicy(epsilon_budget=math.inf, state_dir=Path("."), **{
                k.replace("-", "_"): v for k, v in mode_policy(config, len(SIZES)).items()})
            q, lattice = read_lattice(strategy.setup.config(), assigner.plan.max_grad_norm,
                                      strategy.setup.lattice.dimension)
            share = lattice.noise_stddev(sigma, policy.honest_shares)
            node.record(smallest.client_id, entry, (distributed_dpsgd_event(
                share, policy.honest_shares, lattice.sensitivity, lattice.dimension, q, 1),))
            node_eps.append(node.spent(smallest.client_id))
    return sigma, server_eps, [node_eps] if node_eps else []


@pytest.mark.parametrize("noise", sorted(NOISE))
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_plans_sigma_and_epsilon_per_round_are_the_runs_ledgers(mode, model, noise):
    dataset = "cifar10" if model == "cifar_cnn" else "mnist"
    config = {"dataset": dataset, "model": model, "rounds": ROUNDS, "lot-size": LOT, "delta": DELTA,
              **MODES[mode], **NOISE[noise]}
    sigma, server_eps, node_eps = _run_side(config)
    settings = RunSettings.from_run_config(config)
    fed = Federation(population=len(SIZES), rounds=ROUNDS, delta=DELTA, cohort=settings.cohort, sizes=SIZES,
                     lot_size=LOT, target_epsilon=settings.target_epsilon,
                     noise_multiplier=settings.noise_multiplier, dataset=dataset, model=model,
                     user_clip=settings.user_clip, lattice_rounding=str(settings.lattice_rounding))
    column = plan(fed, [mode])["modes"][mode]
    assert column["noise_multiplier"] == pytest.approx(sigma, rel=1e-9)
    assert column["epsilon"] == pytest.approx(server_eps, rel=1e-9)
    for ledger in node_eps:
        assert column["epsilon"] == pytest.approx(ledger, rel=1e-9)


@pytest.mark.parametrize("noise", sorted(NOISE))
def test_without_a_lot_distributed_mode_plans_and_runs_the_large_lot_of_three_steps_an_epoch(noise):
    config = {"model": "cnn", "rounds": ROUNDS, "delta": DELTA, "privacy": "distributed", **NOISE[noise]}
    sigma, server_eps, node_eps = _run_side(config)
    settings = RunSettings.from_run_config(config)
    column = plan(Federation(population=len(SIZES), rounds=ROUNDS, delta=DELTA, sizes=SIZES, model="cnn",
                             target_epsilon=settings.target_epsilon, noise_multiplier=settings.noise_multiplier),
                  ["distributed"])["modes"]["distributed"]
    assert column["lot_size"] == math.ceil(sum(SIZES) / 3) and round(1 / column["sample_rate"]) == 3
    assert column["noise_multiplier"] == pytest.approx(sigma, rel=1e-9)
    assert column["epsilon"] == pytest.approx(server_eps, rel=1e-9) == node_eps[0]


def test_a_given_sigma_is_kept_beside_a_target_and_only_prices_the_rounds_it_affords():
    """The issue's ``--noise-multiplier 0.3`` with a target ε: the distributed column keeps 0.3."""
    fed = Federation(population=3, rounds=3, delta=DELTA, sizes=SIZES, lot_size=LOT, target_epsilon=4.0,
                     noise_multiplier=0.3, model="cnn")
    column = plan(fed, ["distributed"])["modes"]["distributed"]
    assert column["noise_multiplier"] == 0.3 and column["rounds_affordable"] == 0 < column["epsilon"][0] - 4.0
