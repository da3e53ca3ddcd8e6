"""``simulations._spent.nothing_to_spend``: the check a simulation makes of ``--state-dir``
before Ray starts. Ledgers are written by hand (a Gaussian release of σ = 0.5, which alone
is ε ≈ 10 at δ = 1e-5, far past the target of 2); the ε the message quotes is checked
against dp-accounting. The command's end-to-end stop is in ``test_simulation.py``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import dp_accounting
import pytest

from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import Budget, GaussianEvent, PrivacyLedger
from simulations._federated import PROJECT_ROOT, build_parser, node_policy_env, simulated_node_policy
from simulations._run_config import run_config_overrides
from simulations._spent import nothing_to_spend

CLIENTS, DELTA, SIGMA = 2, 1e-5, 0.5


@contextlib.contextmanager
def command(state: Path, data_dir: Path, *flags: str) -> Iterator[RunSettings]:
    """The settings of ``simulations.mnist`` with ``flags``, its nodes' policy in force."""
    from flwr.common.config import get_fused_config_from_dir

    args = build_parser("mnist").parse_args(
        ["--clients", str(CLIENTS), "--rounds", "1", "--limit-train", "600", "--lot-size", "64",
         "--target-epsilon", "2", "--data-dir", str(data_dir), "--state-dir", str(state), *flags])
    run_config = get_fused_config_from_dir(PROJECT_ROOT, run_config_overrides(args, "mnist"))
    budget = args.client_epsilon_budget or args.epsilon_budget or args.target_epsilon
    with node_policy_env(simulated_node_policy(run_config, state, budget, args.num_examples_noise), state, CLIENTS):
        yield RunSettings.from_run_config(run_config)


def spend(path: Path, *clients: str) -> None:
    """A ledger at ``path`` in which each of ``clients`` released one Gaussian of σ = SIGMA."""
    ledger = PrivacyLedger(Budget(epsilon=math.inf, delta=DELTA))
    for client in clients:
        ledger.record(client, "earlier-run", (GaussianEvent(SIGMA),))
    ledger.save(path)


def gaussian_epsilon() -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(SIGMA))
    return accountant.get_epsilon(DELTA)


def test_a_fresh_state_dir_has_budget(tmp_path, shared_data_dir):
    with command(tmp_path, shared_data_dir) as settings:
        assert nothing_to_spend(settings, tmp_path, CLIENTS) is None


def test_a_spent_server_ledger_names_it_and_the_flag_that_raises_it(tmp_path, shared_data_dir):
    spend(tmp_path / "ledger.json", "0", "1")
    with command(tmp_path, shared_data_dir) as settings:
        reason = nothing_to_spend(settings, tmp_path, CLIENTS)
    assert reason is not None and "\n" not in reason
    assert "server's ledger" in reason and "--epsilon-budget" in reason and "--client-epsilon-budget" not in reason
    assert str(tmp_path / "ledger.json") in reason
    assert f"ε = {gaussian_epsilon():.4f} of 2 " in reason


def test_spent_node_ledgers_name_the_nodes_budget(tmp_path, shared_data_dir):
    for client in map(str, range(CLIENTS)):
        (tmp_path / "nodes" / client).mkdir(parents=True)
        spend(tmp_path / "nodes" / client / "ledger.json", client)
    with command(tmp_path, shared_data_dir) as settings:
        reason = nothing_to_spend(settings, tmp_path, CLIENTS)
    assert reason is not None and "nodes' own ledgers" in reason
    assert "--client-epsilon-budget" in reason and "epsilon-budget" in reason
    assert str(tmp_path / "nodes" / "0" / "ledger.json") in reason


def test_one_client_with_budget_left_is_enough(tmp_path, shared_data_dir):
    spend(tmp_path / "ledger.json", "0")
    with command(tmp_path, shared_data_dir) as settings:
        assert nothing_to_spend(settings, tmp_path, CLIENTS) is None


@pytest.mark.parametrize("flag", ["--epsilon-budget", "--client-epsilon-budget"])
def test_the_named_flag_raises_the_budget(tmp_path, shared_data_dir, flag):
    """Spent where the flag's budget is checked; with it raised, the run may go on."""
    if flag == "--epsilon-budget":
        spend(tmp_path / "ledger.json", "0", "1")
    else:
        for client in map(str, range(CLIENTS)):
            (tmp_path / "nodes" / client).mkdir(parents=True)
            spend(tmp_path / "nodes" / client / "ledger.json", client)
    with command(tmp_path, shared_data_dir) as settings:
        assert flag in nothing_to_spend(settings, tmp_path, CLIENTS)
    with command(tmp_path, shared_data_dir, flag, "100") as settings:
        assert nothing_to_spend(settings, tmp_path, CLIENTS) is None


def test_a_released_count_of_n_is_left_to_the_run(tmp_path, shared_data_dir):
    """With a DP count of N the server plans with each node's draw: the run decides."""
    spend(tmp_path / "ledger.json", "0", "1")
    with command(tmp_path, shared_data_dir, "--num-examples-noise", "20") as settings:
        assert nothing_to_spend(settings, tmp_path, CLIENTS) is None
