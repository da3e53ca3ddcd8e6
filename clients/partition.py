"""Deterministic partitioning of a training set with flwr-datasets' partitioners.

The partitioners work on an in-memory ``datasets.Dataset`` of (index, label) rows, so
nothing is downloaded and the images stay in their tensors. Each partition's indices
are returned in the data set's original order; a single partition is the whole
training set in order (so ``--clients 1`` trains exactly what centralized training
does). The same (labels, scheme, K, α, seed) always gives the same partitions, in
every process — the server could recompute any client's N, but asks instead.
"""

from __future__ import annotations

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


class Split:
    """One data set's labels split into ``num_partitions``: the partitioner is built once,
    each partition's indices are computed on first use and kept (a few ints per record).
    A process that serves many partitions keeps one ``Split`` per data set
    (``clients.task``) instead of re-keying the partitioner by the labels on every call."""

    def __init__(self, labels: torch.Tensor, scheme: Partition, num_partitions: int, alpha: float,
                 seed: int) -> None:
        self.num_partitions = num_partitions
        self._size = len(labels)
        self._partitioner = None if num_partitions == 1 else \
            _partitioner(labels.tolist(), scheme, num_partitions, alpha, seed)
        self._indices: dict[int, np.ndarray] = {}

    def indices(self, partition_id: int) -> np.ndarray:
        """Indices (ascending) of partition ``partition_id``; read-only (shared by every caller)."""
        if not 0 <= partition_id < self.num_partitions:
            raise ValueError(f"partition id {partition_id} not in [0, {self.num_partitions})")
        if partition_id not in self._indices:
            if self._partitioner is None:
                idx = np.arange(self._size)
            else:
                # the index column as one Arrow array to numpy, not a Python object per row
                part = self._partitioner.load_partition(partition_id).with_format("arrow")
                idx = np.sort(part["index"].to_numpy().astype(np.int64))
            idx.flags.writeable = False
            self._indices[partition_id] = idx
        return self._indices[partition_id]


def _partitioner(
    labels: list[int], scheme: Partition, num_partitions: int, alpha: float, seed: int
) -> Partitioner:
    """A partitioner bound to its data set."""
    part_seed = derive_seed(seed, "partition") % 2**32
    table = datasets.Dataset.from_dict({"index": np.arange(len(labels)), "label": labels})
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
