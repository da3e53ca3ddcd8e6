"""``train_dpsgd``: Abadi et al.'s DP-SGD as named stages, one privacy event per call.

Each step: Poisson lot → noise N(0, σ²C²) drawn into the gradient buffer → per
micro-batch, Σ_i clip(g_i) added into it (so it holds the clipped sum plus its noise;
an example whose gradient is not finite adds exactly 0, see ``clipping``) → divide by the
*expected* lot size (a data-independent scale, right for Poisson lots whose size varies:
q·N by default, q·ñ where N is private and ñ its public estimate) → ``p.grad`` = that
buffer, ``optimizer.step()``.  In ``secure_mode`` lots and noise both come from the OS
CSPRNG and no generator is passed.  The buffer is one
flat tensor allocated per call, not per step: fresh parameter-sized tensors every step
cost page faults that were measured at ~2 ms a step for the 795k-parameter MLP on CPU.
An empty lot still takes a step (pure noise).  The report carries
``dpsgd_event(σ, q, steps)``, the whole privacy cost of the call.  A lot is indices into
the features: an in-memory tensor (the fast path) or a map-style data set's ``ItemFeatures``,
of which each micro-batch fetches only its own items (``items``).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from tqdm.auto import tqdm

from fedpriv.dpsgd.augmentation import Augmentation
from fedpriv.dpsgd.batch import batch_gradient_sum, is_plain
from fedpriv.dpsgd.bookkeeping import bookkeeping_clipped_sum, supports_bookkeeping
from fedpriv.dpsgd.clipping import ClippedSumFn
from fedpriv.dpsgd.config import DPSGDConfig, GradSampleMode
from fedpriv.dpsgd.items import ItemFeatures
from fedpriv.dpsgd.modules import UnsupportedModuleError, check_model, model_device, trainable_parameters
from fedpriv.dpsgd.noise import fill_gaussian_noise_
from fedpriv.dpsgd.per_example import LossFn, vmap_clipped_sum
from fedpriv.dpsgd.sampling import micro_batches, poisson_lot, secure_poisson_lot
from fedpriv.dpsgd.static import static_sums
from fedpriv.privacy.events import DpEvent, dpsgd_event

Features = torch.Tensor | ItemFeatures
"""The (N, ...) features of ``train_dpsgd``: in memory, or fetched lot by lot (``items``)."""

STAGES = (LOT, NOISE, CLIPPED_SUM, UPDATE) = ("dpsgd.lot", "dpsgd.noise", "dpsgd.clipped_sum", "dpsgd.update")
"""Each step's stages as labelled for ``torch.profiler`` (where the time goes: ``benchmarks.dpsgd``)."""


@dataclass(frozen=True)
class TrainReport:
    """What one ``train_dpsgd`` call did.

    ``events`` is its privacy cost.  ``num_examples`` (N, the local data set size, the FedAvg
    weight) and ``mean_loss`` (mean per-example loss over the lots, before each step; a
    non-finite loss counts as 0) are *not* privatised: releasing them is outside the
    reported events.
    """

    events: tuple[DpEvent, ...]
    steps: int
    num_examples: int
    mean_loss: float


def train_dpsgd(
    model: nn.Module,
    features: Features,
    labels: torch.Tensor,
    *,
    config: DPSGDConfig,
    steps: int,
    optimizer: torch.optim.Optimizer,
    sampling_generator: torch.Generator | None = None,
    noise_generator: torch.Generator | None = None,
    loss_fn: LossFn = F.cross_entropy,
    progress: bool = False,
    expected_lot_size: float | None = None,
    static_shapes: bool | None = None,
    augment: Augmentation | None = None,
) -> TrainReport:
    """Run ``steps`` DP-SGD steps on ``model`` (put in train mode) over (features, labels).

    ``features``/``labels`` live on the model's device, as do both generators; ``features``
    may be a map-style data set's ``ItemFeatures`` (each micro-batch fetched; eager steps).
    ``loss_fn(outputs, targets)`` must return the mean per-example loss of a batch.
    Generators: with ``config.secure_mode``, none (lots and noise come from the OS CSPRNG;
    passing one is an error, not a silent downgrade); otherwise ``sampling_generator``, and
    ``noise_generator`` unless σ = 0.
    ``expected_lot_size``: the divisor of the noisy clipped sum, > 0 and finite; by default
    q·N, right when N = ``len(features)`` is public.  Where N is private, pass q·ñ for a
    released estimate ñ, so that the scale reveals nothing more.
    ``static_shapes``: pad each micro-batch to a fixed bucket and, on CUDA, replay each
    bucket's clipped sum from a CUDA graph (``static``: same sums, same events); None (the
    default) does so on CUDA unless ``$FEDPRIV_CUDA_GRAPHS`` is ``0`` or the schedule is
    the non-private one (whose batched gradient has few launches anyway).
    ``augment``: each example's gradient is the mean over its ``augment.multiplicity``
    augmented copies, before clipping (``augmentation``; the event is unchanged); eager.
    """
    params = trainable_parameters(model)
    num_examples = _check_inputs(params, features, labels, steps, sampling_generator, noise_generator, config)
    check_model(model)
    divisor = _divisor(expected_lot_size, config.sample_rate * num_examples)
    model.train()
    if config.secure_mode:
        draw_lot = partial(secure_poisson_lot, num_examples, config.sample_rate, features.device)
    elif sampling_generator is not None:
        draw_lot = partial(poisson_lot, num_examples, config.sample_rate, sampling_generator)
    else:  # refused by _check_inputs already
        raise ValueError("sampling_generator is required unless secure_mode=True")
    loss_total = torch.zeros((), device=features.device)
    examples_seen = 0
    with clipped_sum_function(model, params, loss_fn, config) as clipped_sum:
        if augment is None and isinstance(features, torch.Tensor) and use_static_shapes(static_shapes, config,
                                                                                        features.device):
            sums = static_sums(model, params, features, labels, config, loss_fn)
            flat, grads = sums.flat, sums.grads
            lot_sum = sums.lot_sum(clipped_sum, config.max_physical_batch_size)
        else:
            flat, grads = gradient_buffers(params)
            lot_sum = partial(add_clipped_sums_, clipped_sum, features, labels, into=grads, config=config,
                              augment=augment)
        for _ in tqdm(range(steps), desc="DP-SGD", disable=not progress):
            with record_function(LOT):
                lot = draw_lot()
            with record_function(NOISE):
                fill_gaussian_noise_(flat, config.noise_std, noise_generator, config.secure_mode)
            with record_function(CLIPPED_SUM):
                loss_total += lot_sum(lot)
            with record_function(UPDATE):
                flat.div_(divisor)
                apply_gradients(params, grads, optimizer)
            examples_seen += lot.numel()
    mean_loss = loss_total.item() / examples_seen if examples_seen else float("nan")
    return TrainReport(events=spent_events(config, steps), steps=steps, num_examples=num_examples, mean_loss=mean_loss)


CUDA_GRAPHS_ENV = "FEDPRIV_CUDA_GRAPHS"
"""``0`` turns the default CUDA-graph capture of ``train_dpsgd`` off (eager steps)."""


def use_static_shapes(requested: bool | None, config: DPSGDConfig, device: torch.device) -> bool:
    """``requested`` if given, else: on CUDA, for a private schedule, unless ``CUDA_GRAPHS_ENV`` is 0."""
    if requested is not None:
        return requested
    return device.type == "cuda" and not is_plain(config) and os.environ.get(CUDA_GRAPHS_ENV, "1") != "0"


def spent_events(config: DPSGDConfig, steps: int) -> tuple[DpEvent, ...]:
    """What ``train_dpsgd`` spends for ``steps`` steps under ``config``: known before it runs,
    so a caller can check a charge against it before booking."""
    return (dpsgd_event(config.noise_multiplier, config.sample_rate, steps),)


def resolve_grad_sample_mode(model: nn.Module, config: DPSGDConfig) -> GradSampleMode:
    """The concrete mode: ``AUTO`` picks book-keeping whenever the model supports it."""
    if config.grad_sample_mode is GradSampleMode.AUTO:
        return GradSampleMode.BOOKKEEPING if supports_bookkeeping(model) else GradSampleMode.VMAP
    return config.grad_sample_mode


@contextmanager
def clipped_sum_function(
    model: nn.Module, params: dict[str, torch.Tensor], loss_fn: LossFn, config: DPSGDConfig
) -> Iterator[ClippedSumFn]:
    """Yield ``clipped_sum(features, labels, into)`` for the config's gradient mode.

    In ``AUTO`` mode the non-private schedule (σ = 0, C = ∞) takes one batched gradient
    (``batch``); otherwise a layer that turns out to run twice per forward (found only at
    run time, before any gradient is taken) switches the rest of the call to vmap.
    """
    plain = partial(vmap_clipped_sum, model, params, loss_fn=loss_fn, config=config)
    if config.grad_sample_mode is GradSampleMode.AUTO and is_plain(config):
        yield batch_gradient_sum(model, params, loss_fn, config, per_example=plain)
        return
    if resolve_grad_sample_mode(model, config) is GradSampleMode.VMAP:
        yield plain
        return
    with ExitStack() as hooks:
        bookkeeping = hooks.enter_context(bookkeeping_clipped_sum(model, params, loss_fn, config))
        if config.grad_sample_mode is GradSampleMode.BOOKKEEPING:
            yield bookkeeping
            return
        chosen = bookkeeping

        def clipped_sum(
            features: torch.Tensor, labels: torch.Tensor, into: Sequence[torch.Tensor],
            mask: torch.Tensor | None = None,
        ) -> torch.Tensor:
            nonlocal chosen
            if chosen is plain:
                return plain(features, labels, into, mask=mask)
            try:
                return bookkeeping(features, labels, into, mask)
            except UnsupportedModuleError:  # raised in the forward pass, before adding into
                hooks.close()  # remove the hooks; from now on, vmap
                chosen = plain
                return plain(features, labels, into, mask=mask)

        yield clipped_sum


def gradient_buffers(params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat buffer for all of ``params``' gradients, and a view of it shaped like each
    (contiguous, also for a channels_last parameter: the optimizer's update is layout-blind)."""
    first = next(iter(params.values()))
    flat = torch.empty(sum(p.numel() for p in params.values()), dtype=first.dtype, device=first.device)
    parts = flat.split([p.numel() for p in params.values()])
    return flat, [part.view_as(p) for part, p in zip(parts, params.values(), strict=True)]


def add_clipped_sums_(
    clipped_sum: ClippedSumFn,
    features: Features,
    labels: torch.Tensor,
    lot: torch.Tensor,
    into: Sequence[torch.Tensor],
    config: DPSGDConfig,
    augment: Augmentation | None = None,
) -> torch.Tensor:
    """Add Σ over the lot of clipped per-example gradients into ``into``, one micro-batch at
    a time (each example's gradient over its ``augment``ed copies); return Σ over the lot of
    per-example losses (0 for an empty lot)."""
    loss_sum = torch.zeros((), device=features.device)
    for batch in micro_batches(lot, config.max_physical_batch_size):
        inputs, targets = examples_at(features, labels, batch)
        loss_sum += clipped_sum(inputs if augment is None else augment(inputs), targets, into)
    return loss_sum


def examples_at(
    features: Features, labels: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples at ``indices`` (ascending, distinct): all of an in-memory tensor as they
    are, uncopied; of ``ItemFeatures``, those items alone, fetched now."""
    if len(indices) == len(features) and isinstance(features, torch.Tensor):
        return features, labels
    return features[indices], labels[indices]


def apply_gradients(
    params: dict[str, torch.Tensor], grads: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer
) -> None:
    """Hand the privatised gradient to any torch optimizer: ``p.grad = g``; ``step()``."""
    for p, g in zip(params.values(), grads, strict=True):
        p.grad = g
    optimizer.step()


def _divisor(expected_lot_size: float | None, default: float) -> float:
    if expected_lot_size is None:
        return default
    if not isinstance(expected_lot_size, numbers.Real) or isinstance(expected_lot_size, bool):
        raise ValueError(f"expected_lot_size must be a number, got {expected_lot_size!r}")
    if not (math.isfinite(expected_lot_size) and expected_lot_size > 0):
        raise ValueError(f"expected_lot_size must be finite and > 0, got {expected_lot_size!r}")
    return float(expected_lot_size)


def _check_inputs(
    params: dict[str, torch.Tensor],
    features: Features,
    labels: torch.Tensor,
    steps: int,
    sampling_generator: torch.Generator | None,
    noise_generator: torch.Generator | None,
    config: DPSGDConfig,
) -> int:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    if len(features) != len(labels) or len(features) == 0:
        raise ValueError(f"need as many labels as features, at least one: {len(features)} vs {len(labels)}")
    device = model_device(params)
    for name, tensor in (("features", features), ("labels", labels)):
        if tensor.device != device:
            raise ValueError(f"{name} are on {tensor.device} but the model is on {device}")
    if config.secure_mode:
        if sampling_generator is not None or noise_generator is not None:
            raise ValueError(
                "secure_mode draws lots and noise from the OS CSPRNG: pass no sampling_generator "
                "or noise_generator (they would not be used)"
            )
    elif sampling_generator is None:
        raise ValueError("sampling_generator is required unless secure_mode=True")
    elif noise_generator is None and config.noise_multiplier > 0:
        raise ValueError("noise_generator is required unless secure_mode=True")
    if noise_generator is not None and noise_generator is sampling_generator:
        raise ValueError("sampling and noise must use separate generators")
    for name, gen in (("sampling_generator", sampling_generator), ("noise_generator", noise_generator)):
        if gen is not None and gen.device.type != device.type:
            raise ValueError(f"{name} is on {gen.device} but the data are on {device}")
    return len(features)
