"""A process that serves many simulated nodes keeps one split of the data set; each node
still gets exactly its own partition, however the calls interleave."""

import numpy as np
import pytest
import torch

from clients import task
from fedpriv.data import load_dataset
from fedpriv.federation.partition import Split
from fedpriv.federation.settings import Partition, RunSettings

K = 50  # partitions of the first 500 training examples: more than the per-partition cache holds


@pytest.fixture
def settings():
    return RunSettings.from_run_config({"limit-train": 500, "seed": 4})


@pytest.mark.parametrize("scheme", [Partition.IID, Partition.DIRICHLET])
def test_each_node_gets_its_own_partition_whatever_the_order(shared_data_dir, scheme):
    settings = RunSettings.from_run_config({"limit-train": 500, "seed": 4, "partition": scheme.value})
    full = load_dataset("mnist", str(shared_data_dir), train=True, limit=500)
    expected = Split(full.features, full.labels, scheme, K, settings.alpha, key=2)  # a fresh split, no cache
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(K), rng.permutation(K)])  # every node twice, interleaved
    seen: set[int] = set()
    for pid in order.tolist():
        data = task.local_data(settings, {"partition-id": pid, "num-partitions": K}, shared_data_dir, partition_key=2)
        idx = torch.tensor(expected.indices(pid))
        assert torch.equal(data.labels, full.labels[idx]) and torch.equal(data.features, full.features[idx])
        seen.add(pid)
    covered = np.concatenate([expected.indices(p) for p in seen])
    assert len(np.unique(covered)) == len(covered)  # disjoint partitions


def test_the_cached_indices_cannot_be_changed_by_a_caller(settings, shared_data_dir):
    split = task._split(settings, shared_data_dir, K, True, 0)
    with pytest.raises(ValueError, match="read-only"):
        split.indices(3)[0] = 0
    with pytest.raises(ValueError, match="not in"):
        split.indices(K)


def test_one_split_per_process_and_data_set(settings, shared_data_dir):
    task._split.cache_clear()
    for pid in range(K):
        task.local_data(settings, {"partition-id": pid, "num-partitions": K}, shared_data_dir, partition_key=0)
    assert task._split.cache_info().currsize == 1  # the partitioner was built once, not per node
    other = RunSettings.from_run_config({"limit-train": 400, "seed": 4})
    task.local_data(other, {"partition-id": 0, "num-partitions": K}, shared_data_dir, partition_key=0)
    assert task._split.cache_info().currsize == 2  # another data set: its own split
    elsewhere = RunSettings.from_run_config({"limit-train": 400, "seed": 4, "data-dir": "/srv/the-servers-choice"})
    task.local_data(elsewhere, {"partition-id": 1, "num-partitions": K}, shared_data_dir, partition_key=0)
    assert task._split.cache_info().currsize == 2  # the run config's data-dir is the server's: no other split
