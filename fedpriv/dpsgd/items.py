"""A map-style data set's features, read lot by lot: the engine's lazy path.

``train_dpsgd`` draws each Poisson lot as indices and takes the examples at them
(``engine.examples_at``): from an in-memory tensor by indexing (the fast path), or, for an
``ItemFeatures``, by fetching only those items from the data set (``__getitems__`` where
it has one, as torch's ``DataLoader`` uses it, else ``__getitem__`` one by one) and
stacking them, one micro-batch at a time. So a data set of any size trains with no more
than a physical batch of its items in memory; the labels, an integer each, are held.

An ``ItemFeatures`` stands in for the (N, ...) features tensor wherever the engine, the
training routine and a node apply one: ``len``, ``shape``, ``dtype``, ``device``,
``to(device)`` and indexing by an integer, a slice or a tensor of indices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

ToTensor = Callable[[Any, int], torch.Tensor]
"""``to_tensor(x, index)``: an item's x as a tensor (checked: one shape and dtype for all)."""


@dataclass(frozen=True)
class ItemFeatures:
    """The x of each (x, y) item of the map-style ``data``, fetched when indexed. ``shape``
    and ``dtype`` are the stacked tensor's; ``to_tensor`` turns one item's x into a tensor."""

    data: Any
    shape: torch.Size
    dtype: torch.dtype
    to_tensor: ToTensor
    device: torch.device = torch.device("cpu")

    def __len__(self) -> int:
        return self.shape[0]

    def to(self, device: torch.device | str) -> ItemFeatures:
        """The same items, fetched onto ``device``."""
        return replace(self, device=torch.device(device))

    def __getitem__(self, key: int | slice | torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The features at ``key`` (an index, a slice, or indices), fetched now: a tensor on ``device``."""
        if isinstance(key, int):
            return self.fetch([key])[0]
        if isinstance(key, slice):
            return self.fetch(range(*key.indices(len(self))))
        return self.fetch(key.tolist() if isinstance(key, torch.Tensor) else list(key))

    def fetch(self, indices: Sequence[int]) -> torch.Tensor:
        """The stacked x of the items at ``indices``, each checked against ``shape`` and ``dtype``."""
        indices = list(indices)
        getitems = getattr(self.data, "__getitems__", None)
        items = getitems(indices) if getitems is not None else [self.data[i] for i in indices]
        if len(items) != len(indices):
            raise ValueError(f"the data set returned {len(items)} items for {len(indices)} indices")
        xs = [self.to_tensor(item[0], i) for i, item in zip(indices, items, strict=True)]
        for i, x in zip(indices, xs, strict=True):
            if x.shape != self.shape[1:] or x.dtype != self.dtype:
                raise ValueError(f"item {i} changed: x is {tuple(x.shape)} {x.dtype}, was {tuple(self.shape[1:])} "
                                 f"{self.dtype} when the data set was checked")
        stacked = torch.stack(xs) if xs else torch.empty((0, *self.shape[1:]), dtype=self.dtype)
        return stacked.to(self.device)
