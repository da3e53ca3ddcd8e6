"""The one local-training routine: centralized baseline and Flower client both call it.

``train_round(model, features, labels, plan, seed=, client=, round_=, device=)`` builds a
fresh optimizer, takes ``round_generators(seed, client, round_)`` and runs
``local_epochs × steps_per_epoch(q)`` DP-SGD steps at the plan's q (lot_size / ñ by
default, ñ = N unless the caller passes a released estimate of a private N). Centralized
training is ``train_round(..., client=0, round_=epoch)`` for epoch = 1..E, so a
single-client federated run with one local epoch per round and R = E rounds reproduces
its final parameters bit for bit (``model_sha256``) and its privacy events exactly.

The physical batch (micro-batch size) is the plan's ``max_physical_batch_size`` or, where
that is None, the largest whose measured step memory fits the device
(``fedpriv.dpsgd.memory``); it splits the computation of a lot, never the lot itself.

Invariant: nothing here depends on state carried across rounds (no optimizer state, no
LR schedule outside ``plan``); everything a round needs is (plan, seed, client, round_).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd import TrainReport, train_dpsgd
from fedpriv.dpsgd.augmentation import Augmentation
from fedpriv.dpsgd.engine import spent_events
from fedpriv.dpsgd.memory import StepMemory, device_budget, fit_batch, measure_step_memory, probe_config
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.privacy.events import DpEvent
from fedpriv.seeding import round_generators
from fedpriv.training.plan import OptimizerKind, TrainingPlan


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_STEP_MEMORY: dict[tuple[Any, ...], StepMemory] = {}


def with_physical_batch(
    plan: TrainingPlan, model: nn.Module, features: torch.Tensor, device: torch.device | str, secure: bool = False,
    fit: bool = False, augment: Augmentation | None = None, loss_fn: LossFn = F.cross_entropy,
) -> TrainingPlan:
    """``plan`` with a physical batch: its own, or the largest whose measured step (with the
    plan's model, optimizer and clipping; ``secure``: the CSPRNG's noise) fits
    ``device_budget(device)``, at most ``len(features)``. With ``fit``, the plan's own is only
    an upper bound (a request from a server, which knows nothing of this device): the
    smaller of the two. ``model`` is on ``device``; its step memory is measured once per
    process for each kind of step. With ``augment``, a micro-batch of B examples runs the
    model on B·K inputs of ``augment.input_shape``: B is what fits for B·K, divided by K."""
    requested = plan.max_physical_batch_size
    if requested is not None and not fit:
        return plan
    device = torch.device(device)
    config = dataclasses.replace(plan.dpsgd_config(len(features), physical_batch=1), secure_mode=secure)
    sample_shape = tuple(features.shape[1:]) if augment is None else augment.input_shape
    multiplicity = 1 if augment is None else augment.multiplicity
    key = (plan.model, plan.optimizer, plan.momentum > 0, probe_config(config), sample_shape, features.dtype, device,
           loss_fn, sum(p.numel() for p in model.parameters()))  # a user's task: its model and loss
    if key not in _STEP_MEMORY:
        _STEP_MEMORY[key] = measure_step_memory(
            model, sample_shape, config, optimizer=lambda m: make_optimizer(m, plan, 1), dtype=features.dtype,
            loss_fn=loss_fn,
        )
    size = max(1, fit_batch(_STEP_MEMORY[key], device_budget(device), max_batch=len(features) * multiplicity)
               // multiplicity)
    return dataclasses.replace(plan, max_physical_batch_size=size if requested is None else min(size, requested))


def make_optimizer(model: nn.Module, plan: TrainingPlan, round_: int) -> torch.optim.Optimizer:
    """A fresh optimizer for round ``round_`` (no state crosses rounds)."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = plan.lr_at(round_)
    if plan.optimizer is OptimizerKind.ADAM:
        return torch.optim.Adam(params, lr=lr, betas=(plan.momentum, 0.999))
    return torch.optim.SGD(params, lr=lr, momentum=plan.momentum)


def train_round(
    model: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    plan: TrainingPlan,
    *,
    seed: int,
    client: int,
    round_: int,
    device: torch.device | str,
    progress: bool = False,
    secure: bool = False,
    num_examples: int | None = None,
    fit_physical_batch: bool = False,
    augment: Augmentation | None = None,
    loss_fn: LossFn = F.cross_entropy,
) -> TrainReport:
    """One round of local DP-SGD for ``client`` in round ``round_`` (1-based), in place.

    Moves model and data to ``device``; the report's events, ``plan.round_events(ñ)``, are
    the round's whole privacy cost. Lots and noise come from
    ``round_generators(seed, client, round_)``; with ``secure`` both come from the OS
    CSPRNG instead (not reproducible, and secret even from whoever knows ``seed``, which is
    then unused).

    ``num_examples`` is ñ, the public (released) data set size the plan is computed for:
    q = ``plan.sample_rate(ñ)``, ``plan.steps_per_round(ñ)`` steps, and the noisy clipped
    sum divided by q·ñ, so nothing but ñ depends on the private N = ``len(labels)``.
    None means ñ = N (a public N; the centralized run and simulations).
    A plan without a physical batch gets one for ``device`` (``with_physical_batch``); with
    ``fit_physical_batch`` a plan's own is capped at that too (a node, whose plan comes from
    the server, never computes more at once than its memory holds).
    ``augment``: augmentation multiplicity (``fedpriv.dpsgd.augmentation``; the events are
    unchanged), its generator the caller's, drawn for this round. ``loss_fn``: the mean loss
    of a batch (a user's task's ``loss``).
    """
    if num_examples is None:
        num_examples = len(labels)
    elif not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples < 1:
        raise ValueError(f"num_examples must be an integer >= 1, got {num_examples!r}")
    device = torch.device(device)
    model.to(device)
    features, labels = features.to(device), labels.to(device)
    config = with_physical_batch(plan, model, features, device, secure, fit_physical_batch,
                                 augment, loss_fn).dpsgd_config(num_examples)
    if secure:
        config, sampling, noise = dataclasses.replace(config, secure_mode=True), None, None
    else:
        sampling, noise = round_generators(seed, client, round_, device=device)
    return train_dpsgd(
        model,
        features,
        labels,
        config=config,
        steps=plan.steps_per_round(num_examples),
        optimizer=make_optimizer(model, plan, round_),
        sampling_generator=sampling,
        noise_generator=noise,
        progress=progress,
        expected_lot_size=config.sample_rate * num_examples,
        augment=augment,
        loss_fn=loss_fn,
    )


def round_spend(plan: TrainingPlan, num_examples: int) -> tuple[DpEvent, ...]:
    """What ``train_round`` spends for ``plan`` on ñ = ``num_examples``, by the DP-SGD
    engine's own account (``spent_events``; the physical batch changes nothing): a node
    checks its charge against it before booking."""
    return spent_events(plan.dpsgd_config(num_examples, physical_batch=1), plan.steps_per_round(num_examples))
