"""The node policy: read from the node's own configuration, never from the run config."""

import math

import pytest

from fedpriv.federation.policy import POLICY_ENV, PolicyError, Randomness, load_policy, policy_file_text
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import Budget


def test_a_policy_file_with_node_config_overrides(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(f'epsilon-budget = 3.0\ndelta = 1e-6\nstate-dir = "{tmp_path}/n/{{partition-id}}"\n'
                    'randomness = "seeded"\nseed = 4\nallow-evaluate = true\n')
    policy = load_policy({"partition-id": 2, "policy": str(path), "epsilon-budget": 1.5}, environ={})
    assert policy.epsilon_budget == 1.5 and policy.delta == 1e-6
    assert policy.state_dir == (tmp_path / "n" / "2").resolve()
    assert policy.randomness is Randomness.SEEDED and policy.seed == 4 and policy.allow_evaluate
    assert not policy.public_num_examples  # private N unless the operator says otherwise
    from_env = load_policy({"partition-id": 0}, environ={POLICY_ENV: str(path)})
    assert from_env.epsilon_budget == 3.0


@pytest.mark.parametrize("node_config, missing", [
    ({"partition-id": 0}, "epsilon-budget"),
    ({"partition-id": 0, "epsilon-budget": 1.0}, "state-dir"),
])
def test_a_missing_budget_or_state_fails_closed(node_config, missing):
    with pytest.raises(PolicyError, match=missing):
        load_policy(node_config, environ={})


@pytest.mark.parametrize("bad", [
    {"epsilon-budget": 0.0}, {"epsilon-budget": "lots"}, {"delta": 1.0}, {"randomness": "seeded"},
    {"seed": 3}, {"num-examples-noise": 0.0}, {"public-num-examples": "maybe"},
])
def test_bad_values_are_refused(tmp_path, bad):
    with pytest.raises(PolicyError):
        load_policy({"epsilon-budget": 1.0, "state-dir": str(tmp_path), **bad}, environ={})


def test_unknown_keys_in_a_policy_file_are_an_error(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('epsilon-budget = 1.0\nstate-dir = "x"\nepsilon-bugdet = 9.0\n')
    with pytest.raises(PolicyError, match="epsilon-bugdet"):
        load_policy({"policy": str(path)}, environ={})


def test_an_unlimited_budget_must_be_written_out(tmp_path):
    assert math.isinf(load_policy({"epsilon-budget": math.inf, "state-dir": str(tmp_path)}, environ={}).epsilon_budget)


def test_the_run_tightens_and_never_loosens(tmp_path):
    policy = load_policy({"epsilon-budget": 2.0, "delta": 1e-5, "state-dir": str(tmp_path)}, environ={})
    assert policy.effective_budget(RunSettings(delta=0.5, client_epsilon_budget=50.0)) == Budget(2.0, 1e-5)
    assert policy.effective_budget(RunSettings(delta=1e-7, client_epsilon_budget=0.5)) == Budget(0.5, 1e-7)


def test_simulated_and_deployed_nodes_get_the_commands_data_dir_in_their_policy(tmp_path, monkeypatch):
    from simulations._federated import simulated_node_policy
    from simulations._orchestrator import NodeFiles, node_policy

    tmp_path = tmp_path.resolve()
    monkeypatch.chdir(tmp_path)
    run_config = {"delta": 1e-5, "seed": 1, "fraction-evaluate": 0.0}
    simulated = simulated_node_policy({**run_config, "data-dir": "data"}, tmp_path)
    assert simulated["data-dir"] == str(tmp_path / "data")  # absolute: Ray workers' cwd differs
    assert "data-dir" not in simulated_node_policy({**run_config, "data-dir": ""}, tmp_path)  # the default folder
    deployed = node_policy(NodeFiles(tmp_path / "n0"), 1.0, 1e-5, "0" * 64, tmp_path / "data")
    for policy in (simulated, deployed):
        path = tmp_path / "policy.toml"
        path.write_text(policy_file_text(policy))
        assert load_policy({"policy": str(path), "partition-id": 0}, environ={}).data_dir == tmp_path / "data"
