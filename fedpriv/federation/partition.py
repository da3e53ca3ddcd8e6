"""Which records of a node's data set make up its partition: a rule per record.

Record r is in partition p of n iff its *position* u_r ∈ [0, 1) — a keyed BLAKE2b hash of
the record's own bytes (features and label) under the node policy's ``partition-key`` —
falls into p's slice. Membership of a record therefore depends on that record, the key,
the scheme, n and α alone: adding or removing any other record (or reordering the files)
moves no one in or out of a share, and the server's run-config ``seed`` chooses nothing.
So the data set a node's DP guarantee protects is its whole data folder: a neighbouring
folder (one record more or less) yields a neighbouring share.

- ``iid``: slice [p/n, (p+1)/n).
- ``dirichlet``: label y's proportions (π_y,1..π_y,n) ~ Dir(α) are drawn from the key, n
  and y alone; the record goes to the slot of its label's cumulative proportions that u_r
  falls into. The label skew is the classic Dirichlet split's; the sizes are not
  re-drawn until each partition is non-empty (that would depend on the data), so with few
  records a partition may be empty.
- ``shard``: McMahan et al.'s pathological split, per record: a record's place on the line
  of (label, u) pairs is t = (y + u) / classes; t's slice of 2n equal *shards* names the
  shard, and a key-drawn permutation deals two shards to each partition. With balanced
  labels a partition holds records of about two labels, as in the sorted-shard original.

Each partition's indices are returned ascending (the data set's order); a single
partition is the whole data set in order (``--clients 1`` trains exactly what centralized
training does).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from fedpriv.federation.settings import Partition

SHARDS_PER_CLIENT = 2  # McMahan et al.'s pathological non-IID split
NUM_CLASSES = 10  # of every data set the ClientApp trains on (MNIST, CIFAR-10); the shard line's length


def positions(features: torch.Tensor, labels: torch.Tensor, key: int) -> np.ndarray:
    """Each record's position in [0, 1): its keyed hash (features' bytes and label) / 2⁶⁴,
    to 53 bits."""
    x = features.detach().cpu().contiguous().numpy().reshape(len(labels), -1)
    y = labels.detach().cpu().numpy().astype(np.int64)
    hash_key = hashlib.sha256(f"fedpriv-partition/{int(key)}".encode()).digest()
    out = np.empty(len(y), dtype=np.float64)
    for i in range(len(y)):
        digest = hashlib.blake2b(x[i].tobytes() + int(y[i]).to_bytes(8, "little", signed=True),
                                 digest_size=8, key=hash_key).digest()
        out[i] = (int.from_bytes(digest, "little") >> 11) / 2.0**53
    return out


def _rng(key: int, *path: int | str) -> np.random.Generator:
    """A generator drawn from the node's key and ``path`` alone (never from the data)."""
    digest = hashlib.sha256("/".join(["fedpriv-partition", str(int(key)), *map(str, path)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def dirichlet_proportions(key: int, num_partitions: int, alpha: float, label: int) -> np.ndarray:
    """Label ``label``'s shares of the ``num_partitions`` partitions, ~ Dir(α, …, α)."""
    return _rng(key, "dirichlet", num_partitions, repr(float(alpha)), int(label)).dirichlet(
        np.full(num_partitions, alpha))


def assign(u: np.ndarray, labels: np.ndarray, scheme: Partition, num_partitions: int, alpha: float,
           key: int) -> np.ndarray:
    """Each record's partition, from its position ``u`` and label alone (see the module docstring)."""
    n = num_partitions
    if scheme is Partition.IID:
        part = np.floor(u * n).astype(np.int64)
    elif scheme is Partition.DIRICHLET:
        part = np.empty(len(u), dtype=np.int64)
        for label in np.unique(labels):
            mine = labels == label
            bounds = np.cumsum(dirichlet_proportions(key, n, alpha, int(label)))[:-1]
            part[mine] = np.searchsorted(bounds, u[mine], side="right")
    else:
        shards = SHARDS_PER_CLIENT * n
        shard = np.floor((labels.astype(np.float64) + u) / NUM_CLASSES * shards).astype(np.int64)
        owner = _rng(key, "shard", n).permutation(shards) % n  # shard -> partition, two shards each
        part = owner[np.clip(shard, 0, shards - 1)]
    return np.minimum(part, n - 1)


class Split:
    """A data set's records split into ``num_partitions`` by the rule above, keyed by the
    node policy's ``partition-key``. Computed once per data set (one hash per record) and
    kept; a process serving many simulated nodes keeps one ``Split`` per data set
    (``clients.task``)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, scheme: Partition, num_partitions: int,
                 alpha: float, key: int) -> None:
        self.num_partitions = num_partitions
        self._size = len(labels)
        self._part = None if num_partitions == 1 else \
            assign(positions(features, labels, key), labels.numpy(), scheme, num_partitions, alpha, key)
        self._indices: dict[int, np.ndarray] = {}

    def indices(self, partition_id: int) -> np.ndarray:
        """Indices (ascending) of partition ``partition_id``; read-only (shared by every caller)."""
        if not 0 <= partition_id < self.num_partitions:
            raise ValueError(f"partition id {partition_id} not in [0, {self.num_partitions})")
        if partition_id not in self._indices:
            idx = np.arange(self._size) if self._part is None else np.flatnonzero(self._part == partition_id)
            idx.flags.writeable = False
            self._indices[partition_id] = idx
        return self._indices[partition_id]
