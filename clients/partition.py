"""Deterministic partitioning of a training set with flwr-datasets' partitioners.

The partitioners work on an in-memory ``datasets.Dataset`` of (index, label) rows, so
nothing is downloaded and the images stay in their tensors. Each partition's indices
are returned in the data set's original order; a single partition is the whole
training set in order (so ``--clients 1`` trains exactly what centralized training
does). The same (labels, scheme, K, α, seed) always gives the same partitions, in
every process — the server could recompute any client's N, but asks instead.
"""

from __future__ import annotations

import functools

import datasets
import numpy as np
import torch
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    Partitioner,
    ShardPartitioner,
)

from fedpriv.federation.settings import Partition
from fedpriv.seeding import derive_seed

SHARDS_PER_CLIENT = 2  # McMahan et al.'s pathological non-IID split
datasets.disable_progress_bars()


def partition_indices(
    labels: torch.Tensor, scheme: Partition, num_partitions: int, partition_id: int,
    alpha: float, seed: int,
) -> np.ndarray:
    """Indices (ascending) of partition ``partition_id`` of ``num_partitions``."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition id {partition_id} not in [0, {num_partitions})")
    if num_partitions == 1:
        return np.arange(len(labels))
    key = (tuple(labels.tolist()), scheme, num_partitions, alpha, seed)
    part = _partitioner(*key).load_partition(partition_id)
    return np.sort(np.asarray(part["index"], dtype=np.int64))


@functools.lru_cache(maxsize=4)
def _partitioner(
    labels: tuple[int, ...], scheme: Partition, num_partitions: int, alpha: float, seed: int
) -> Partitioner:
    """A partitioner bound to its data set; cached so each process splits only once."""
    part_seed = derive_seed(seed, "partition") % 2**32
    table = datasets.Dataset.from_dict({"index": np.arange(len(labels)), "label": list(labels)})
    partitioner: Partitioner
    if scheme is Partition.IID:
        partitioner = IidPartitioner(num_partitions)
        table = table.shuffle(seed=part_seed).flatten_indices()
    elif scheme is Partition.DIRICHLET:
        partitioner = DirichletPartitioner(
            num_partitions, "label", alpha, min_partition_size=1, seed=part_seed
        )
    else:
        partitioner = ShardPartitioner(
            num_partitions, "label", num_shards_per_partition=SHARDS_PER_CLIENT, seed=part_seed
        )
    partitioner.dataset = table
    return partitioner
