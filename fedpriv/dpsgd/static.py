"""Fixed shapes for a launch-free private step: padded micro-batches, and on CUDA each
bucket's clipped sum captured once in a CUDA graph and replayed.

On a GPU a book-keeping step at batch 256 is bound by the CPU launching its many small
kernels (docs/gpu.md), and a CUDA graph replays a whole micro-batch's kernels in one launch,
but only for fixed shapes, and Poisson lots vary in size.  So each micro-batch (the lot
split at ``max_physical_batch_size`` as in the eager path) is padded up to a *bucket*
(``bucket_size``: eight per octave, so at most 1/8 of it is padding) with copies of example
0 and a False ``mask``.  The clipped-sum functions drop masked rows by selection
(``clipping.clip_factors``): padding adds exactly 0 to the sum and to the loss whatever its
values, and the lot, the sum and the privacy event are those of the eager step.

What stays outside the graph: the lot (drawn by the seeded generator or the OS CSPRNG, then
written into the bucket's static index and mask buffers), the noise (drawn straight into
the static gradient buffer before the micro-batches add into it: every step, seeded or
secure, draws it anew, so no replay can reuse one), the division by the expected lot size
and the optimizer's step.

Memory: a bucket's step never exceeds the physical batch the memory planner chose (buckets
stop at it), and the graphs' shared pool holds about one step's temporaries for as long
as the graphs live, where the eager step frees them after each step.

A ``StaticSums`` is kept per model between ``train_dpsgd`` calls (a round or an epoch is one
call; capturing again each time would cost more than it saves) while the model's parameters,
the data tensors and the clipping settings are the same objects and values.  Where a capture
fails the rest runs eagerly (unpadded), and a warning says so once per process.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedpriv.dpsgd.clipping import ClippedSumFn
from fedpriv.dpsgd.config import DPSGDConfig
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.dpsgd.sampling import micro_batches

WARMUP_RUNS = 3
"""Eager runs of a bucket's computation on a side stream before it is captured (cuBLAS,
autograd and the allocator set themselves up there, as ``torch.cuda.graph`` requires)."""

LotSum = Callable[[torch.Tensor], torch.Tensor]
"""``lot_sum(lot)``: add the lot's clipped sum into the step's gradient buffer; Σ loss_i."""


def bucket_size(n: int, max_size: int) -> int:
    """The padded size of a micro-batch of ``n`` ≥ 1 examples: n rounded up to a multiple of
    2^(bits(n) − 4) (n itself below 16), so at most n/8 padding; never above ``max_size``."""
    step = 1 << max(0, n.bit_length() - 4)
    return min(max_size, -(-n // step) * step)


@dataclass
class _Bucket:
    """One padded shape: static index and mask buffers, and its graph once captured."""

    indices: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    loss: torch.Tensor | None = None  # the graph's output: this replay's Σ loss_i

    def load(self, batch: torch.Tensor) -> None:
        """Write a micro-batch's indices, padded with 0, and its mask (first len(batch) rows)."""
        self.indices[len(batch):].zero_()
        self.indices[: len(batch)].copy_(batch)
        torch.lt(self.positions, len(batch), out=self.mask)


@dataclass
class StaticSums:
    """A lot's clipped sum over fixed-shape micro-batches into its own gradient buffer
    ``flat`` (``grads``: a view per parameter), each bucket captured on CUDA; eager and
    unpadded once ``padded`` is False (a capture failed).  Graphs share one memory pool:
    they run one after another on one stream, and each one's output (``_Bucket.loss``) stays
    referenced, so no capture reuses memory another graph's replay still needs."""

    features: torch.Tensor
    labels: torch.Tensor
    params: tuple[torch.Tensor, ...]
    settings: tuple[object, ...]  # the config's clipping and batch, the loss, where the tensors' data are
    flat: torch.Tensor
    grads: list[torch.Tensor]
    padded: bool
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    pool: Any = None  # a torch.cuda graph pool handle, made at the first capture

    def lot_sum(self, clipped_sum: ClippedSumFn, max_size: int) -> LotSum:
        """``lot_sum(lot)`` for this call's ``clipped_sum`` (its hooks are this call's)."""

        def lot_sum(lot: torch.Tensor) -> torch.Tensor:
            loss = torch.zeros((), device=self.flat.device)
            for batch in micro_batches(lot, max_size):
                if not self.padded:
                    loss += _eager(clipped_sum, self.features, self.labels, batch, self.grads)
                    continue
                bucket = self._bucket(bucket_size(len(batch), max_size))
                bucket.load(batch)
                loss += self._replay(bucket, clipped_sum) if self.flat.is_cuda else self._run(bucket, clipped_sum)
            return loss

        return lot_sum

    def _bucket(self, size: int) -> _Bucket:
        if size not in self.buckets:
            device = self.flat.device
            self.buckets[size] = _Bucket(torch.zeros(size, dtype=torch.long, device=device),
                                         torch.zeros(size, dtype=torch.bool, device=device),
                                         torch.arange(size, device=device))
        return self.buckets[size]

    def _run(self, bucket: _Bucket, clipped_sum: ClippedSumFn, into: Sequence[torch.Tensor] | None = None
             ) -> torch.Tensor:
        """The padded micro-batch's computation, eagerly (what a graph captures)."""
        return clipped_sum(self.features[bucket.indices], self.labels[bucket.indices],
                           self.grads if into is None else into, bucket.mask)

    def _replay(self, bucket: _Bucket, clipped_sum: ClippedSumFn) -> torch.Tensor:
        if bucket.graph is None:
            try:
                self._capture(bucket, clipped_sum)
            except Exception as err:  # noqa: BLE001 - any failure to capture: eager from now on
                _warn_once(f"fedpriv.dpsgd: could not capture the DP-SGD step in a CUDA graph ({type(err).__name__}: "
                           f"{err}); running it eagerly")
                self.padded = False
                return _eager(clipped_sum, self.features, self.labels, bucket.indices[bucket.mask], self.grads)
        assert bucket.graph is not None and bucket.loss is not None
        bucket.graph.replay()
        return bucket.loss

    def _capture(self, bucket: _Bucket, clipped_sum: ClippedSumFn) -> None:
        """Warm up on a side stream (into scratch buffers: the step's own hold its noise),
        then capture one run into ``grads``; capturing executes nothing."""
        scratch = [torch.zeros_like(g) for g in self.grads]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                self._run(bucket, clipped_sum, scratch)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            loss = self._run(bucket, clipped_sum)
        bucket.graph, bucket.loss = graph, loss


def _eager(
    clipped_sum: ClippedSumFn, features: torch.Tensor, labels: torch.Tensor, batch: torch.Tensor,
    into: Sequence[torch.Tensor],
) -> torch.Tensor:
    return clipped_sum(features[batch], labels[batch], into)


_CACHE: weakref.WeakKeyDictionary[nn.Module, StaticSums] = weakref.WeakKeyDictionary()
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def static_sums(
    model: nn.Module, params: dict[str, torch.Tensor], features: torch.Tensor, labels: torch.Tensor,
    config: DPSGDConfig, loss_fn: LossFn,
) -> StaticSums:
    """The model's ``StaticSums`` for these tensors, loss and settings: the cached one if they
    are the same objects (its graphs read and write their memory and computed this loss),
    else a new one."""
    from fedpriv.dpsgd.engine import gradient_buffers  # the engine imports this module

    tensors = tuple(params.values())
    settings = (config.max_grad_norm, config.clipping, config.max_physical_batch_size, config.grad_sample_mode,
                loss_fn, *_storage((*tensors, features, labels)))
    cached = _CACHE.get(model)
    if (cached is not None and cached.features is features and cached.labels is labels
            and cached.settings == settings
            and all(a is b for a, b in zip(cached.params, tensors, strict=True))):
        return cached
    flat, grads = gradient_buffers(params)
    _CACHE[model] = StaticSums(features, labels, tensors, settings, flat, grads, padded=True)
    return _CACHE[model]


def _storage(tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """Where each tensor's data are (a graph reads them there; ``p.data = ...`` moves them)."""
    return tuple(t.data_ptr() for t in tensors)


def cached_static_sums(model: nn.Module) -> StaticSums | None:
    """The ``StaticSums`` kept for ``model``, if any (to see which buckets were captured)."""
    return _CACHE.get(model)
