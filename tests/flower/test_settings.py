"""Run-config parsing and deterministic partitioning (no Flower runtime needed)."""

import math
import tomllib

import numpy as np
import pytest
import torch

from fedpriv.federation.partition import Split
from fedpriv.federation.settings import Partition, RunSettings, SettingsError
from simulations._federated import PROJECT_ROOT


def test_pyproject_defaults_parse_and_unset_sentinels_become_none():
    config = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    settings = RunSettings.from_run_config(config)
    assert settings.target_epsilon is None and settings.noise_multiplier is None
    assert settings.lot_size is None and settings.out is None and settings.data_dir is None
    assert settings.server_budget == math.inf and settings.model is None


def test_kebab_keys_typed_and_validated():
    s = RunSettings.from_run_config({"local-epochs": 2, "target-epsilon": 3.0, "partition": "shard"})
    assert (s.local_epochs, s.target_epsilon, s.partition) == (2, 3.0, Partition.SHARD)
    assert s.server_budget == 3.0
    with pytest.raises(SettingsError, match="unknown"):
        RunSettings.from_run_config({"local_epochs": 2})
    with pytest.raises(SettingsError, match="rounds"):
        RunSettings.from_run_config({"rounds": 1.5})
    with pytest.raises(SettingsError, match="not both"):
        RunSettings.from_run_config({"target-epsilon": 1.0, "noise-multiplier": 1.0})


def test_max_physical_batch_reaches_the_plan_the_nodes_read():
    from fedpriv.federation.protocol import plan_config, read_plan
    from server.assign import base_plan

    auto = RunSettings.from_run_config({"max-physical-batch": 0})
    assert auto.max_physical_batch is None and read_plan(plan_config(base_plan(auto))).max_physical_batch_size is None
    forced = RunSettings.from_run_config({"max-physical-batch": 64})
    assert read_plan(plan_config(base_plan(forced))).max_physical_batch_size == 64
    with pytest.raises(SettingsError, match="max-physical-batch must be >= 1"):
        RunSettings.from_run_config({"max-physical-batch": -3})


@pytest.mark.parametrize("scheme", list(Partition))
def test_partitions_disjoint_cover_sorted_and_reproducible(scheme):
    rng = np.random.default_rng(0)
    features, labels = torch.from_numpy(rng.random((600, 5))), torch.from_numpy(rng.integers(0, 10, 600))
    split = Split(features, labels, scheme, 4, alpha=0.5, key=3)
    parts = [split.indices(i) for i in range(4)]
    joined = np.concatenate(parts)
    assert len(set(joined.tolist())) == len(joined) == 600  # disjoint, covering
    assert all((np.diff(p) > 0).all() for p in parts)
    again = Split(features, labels, scheme, 4, alpha=0.5, key=3).indices(2)
    np.testing.assert_array_equal(again, parts[2])
    if scheme is Partition.IID:  # Binomial(600, 1/4) sizes: 150 ± 10.6
        assert all(abs(len(p) - 150) < 5 * 10.6 for p in parts)
    single = Split(features, labels, scheme, 1, alpha=0.5, key=3).indices(0)
    np.testing.assert_array_equal(single, np.arange(600))
