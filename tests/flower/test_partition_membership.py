"""A node's share of its data folder is a rule per record, keyed by the node's policy
(``partition-key``): another record added or removed moves no record in or out of a share,
and the server's run-config seed chooses none. The Dirichlet split keeps its label skew:
each label's shares follow Dir(α), checked against the Beta marginal's closed form."""

import numpy as np
import pytest
import torch
from scipy import stats

from clients import task
from fedpriv.data import load_dataset
from fedpriv.federation.partition import Split
from fedpriv.federation.settings import Partition, RunSettings

K = 7


def _members(split: Split, records: list[int]) -> dict[int, int]:
    """Record id -> its partition, where ``records[i]`` is the id of the split's record i."""
    return {records[i]: p for p in range(split.num_partitions) for i in split.indices(p).tolist()}


@pytest.fixture(scope="module")
def mnist(shared_data_dir):
    return load_dataset("mnist", str(shared_data_dir), train=True, limit=1001)


@pytest.mark.parametrize("scheme", list(Partition))
def test_adding_or_removing_one_record_moves_no_other_record(mnist, scheme):
    x, y = mnist.features, mnist.labels
    base = _members(Split(x[:1000], y[:1000], scheme, K, 0.5, key=11), list(range(1000)))
    appended = _members(Split(x, y, scheme, K, 0.5, key=11), list(range(1001)))
    order = [1000, *range(1000)]  # the new record first: every other record's index shifts by one
    prepended = _members(Split(x[order], y[order], scheme, K, 0.5, key=11), order)
    kept = [i for i in range(1000) if i != 500]
    removed = _members(Split(x[kept], y[kept], scheme, K, 0.5, key=11), kept)
    assert {i: appended[i] for i in base} == base
    assert {i: prepended[i] for i in base} == base
    assert removed == {i: base[i] for i in kept}
    assert sorted(base.values()) != [0] * 1000 and len(set(base.values())) == K  # a real split


def test_a_share_grows_by_the_new_record_alone_when_the_folder_grows(shared_data_dir):
    # the node's own view: limit-train 1000 vs 1001 records of the same folder
    node = {"partition-id": 3, "num-partitions": K}
    before = task.local_data(RunSettings.from_run_config({"limit-train": 1000}), node, shared_data_dir,
                             partition_key=5)
    after = task.local_data(RunSettings.from_run_config({"limit-train": 1001}), node, shared_data_dir,
                            partition_key=5)
    assert len(after.labels) - len(before.labels) in (0, 1)
    assert torch.equal(after.features[:len(before.labels)], before.features)


def test_the_servers_seed_does_not_choose_a_nodes_share_and_the_nodes_key_does(shared_data_dir):
    node = {"partition-id": 1, "num-partitions": K}

    def share(seed: int, key: int) -> torch.Tensor:
        settings = RunSettings.from_run_config({"limit-train": 700, "seed": seed, "partition": "dirichlet"})
        return task.local_data(settings, node, shared_data_dir, partition_key=key).features

    assert torch.equal(share(0, 4), share(12345, 4))
    assert not (share(0, 4).shape == share(0, 5).shape and torch.equal(share(0, 4), share(0, 5)))


@pytest.mark.parametrize("scheme", list(Partition))
def test_partitions_are_disjoint_and_cover_the_data(mnist, scheme):
    split = Split(mnist.features, mnist.labels, scheme, K, 0.5, key=2)
    joined = np.concatenate([split.indices(p) for p in range(K)])
    assert sorted(joined.tolist()) == list(range(len(mnist.labels)))


def test_the_dirichlet_split_keeps_its_label_skew(shared_data_dir):
    # label y's fraction in partition k is Beta(α, (n-1)α) under Dir(α): mean 1/n,
    # variance (n-1) / (n² (nα + 1)); an IID split's is ~ (1/n)(1-1/n)/N_y, 100 times smaller
    n, alpha = 10, 0.5
    data = load_dataset("mnist", str(shared_data_dir), train=True, limit=10000)
    labels = data.labels.numpy()
    fractions = []
    for key in range(5):
        split = Split(data.features, data.labels, Partition.DIRICHLET, n, alpha, key=key)
        for y in range(10):
            count = (labels == y).sum()
            fractions += [(labels[split.indices(k)] == y).sum() / count for k in range(n)]
    fractions = np.array(fractions)
    beta = stats.beta(alpha, (n - 1) * alpha)
    assert 0.7 < fractions.var() / beta.var() < 1.4
    assert stats.kstest(fractions, beta.cdf).pvalue > 1e-3


def test_the_shard_split_gives_each_partition_two_shards_of_one_label_each(mnist):
    n = 10  # 20 shards on the line of 10 labels: each shard is half of one label's records
    split = Split(mnist.features, mnist.labels, Partition.SHARD, n, 0.5, key=0)
    labels = mnist.labels.numpy()
    assert all(1 <= len(set(labels[split.indices(p)].tolist())) <= 2 for p in range(n))
