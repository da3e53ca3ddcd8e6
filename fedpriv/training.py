"""The one local-training routine: centralized baseline and Flower client both call it.

``train_round(model, features, labels, plan, seed, client, round_, device)`` builds a
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
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd import Clipping, DPSGDConfig, TrainReport, steps_per_epoch, train_dpsgd
from fedpriv.dpsgd.memory import StepMemory, device_budget, fit_batch, measure_step_memory, probe_config
from fedpriv.models import MODELS
from fedpriv.privacy import calibrate_noise_multiplier, dpsgd_event
from fedpriv.privacy.events import DpEvent
from fedpriv.seeding import round_generators


class LRSchedule(StrEnum):
    """How the LR changes over rounds (= epochs of a centralized run)."""

    CONSTANT = "constant"
    COSINE = "cosine"


class OptimizerKind(StrEnum):
    """The optimizer applied to the privatised gradient (post-processing: no privacy cost)."""

    SGD = "sgd"
    ADAM = "adam"


def cosine_lr(lr: float, round_: int, rounds: int) -> float:
    """The LR of round ``round_`` (1-based) decayed by a half cosine over ``rounds``:
    lr · ½(1 + cos(π (r−1)/R)), held at 0 after round R + 1."""
    progress = min(round_ - 1, rounds) / rounds
    return lr * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class TrainingPlan:
    """How one party trains locally in one round; the same plan for every round.

    ``lot_size`` is the *expected* Poisson lot size: q = lot_size / N for a local data set
    of N examples, unless ``shared_sample_rate`` fixes q for every N (a server sharing one
    lot out among its clients: each then samples at the same rate, so all spend the same
    event and one calibration serves them all). ``noise_multiplier = 0`` with
    ``max_grad_norm = inf`` is the non-private schedule (same lots, no clipping, no noise).
    With ``lr_schedule = cosine``, the LR decays by a half cosine over rounds
    1..``lr_decay_rounds`` (which the runner sets to its number of rounds or epochs; 0
    means no horizon yet: constant). The LR is a function of the round only, so a
    federated client applies the very same schedule as a centralized run.
    ``max_physical_batch_size`` None: chosen per device before training (``with_physical_batch``).
    """

    model: str
    lot_size: int
    max_grad_norm: float
    noise_multiplier: float
    lr: float
    momentum: float = 0.9
    optimizer: OptimizerKind | str = OptimizerKind.SGD
    local_epochs: int = 1
    max_physical_batch_size: int | None = None
    clipping: Clipping | str = Clipping.FLAT
    lr_schedule: LRSchedule | str = LRSchedule.CONSTANT
    lr_decay_rounds: int = 0
    shared_sample_rate: float | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for name in ("lot_size", "local_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr!r}")
        if not isinstance(self.lr_decay_rounds, int) or self.lr_decay_rounds < 0:
            raise ValueError(f"lr_decay_rounds must be an integer >= 0, got {self.lr_decay_rounds!r}")
        if self.shared_sample_rate is not None and not 0 < self.shared_sample_rate <= 1:
            raise ValueError(f"shared_sample_rate must be in (0, 1], got {self.shared_sample_rate!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        object.__setattr__(self, "optimizer", OptimizerKind(self.optimizer))
        object.__setattr__(self, "lr_schedule", LRSchedule(self.lr_schedule))
        # σ, C, physical batch size and clipping are the engine's to validate, once.
        config = self.dpsgd_config(num_examples=self.lot_size, physical_batch=1)
        object.__setattr__(self, "clipping", config.clipping)

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0

    def lr_at(self, round_: int) -> float:
        """The LR of round ``round_`` (1-based); cosine: lr · ½(1 + cos(π (r−1)/R)) for r ≤ R."""
        if self.lr_schedule is LRSchedule.CONSTANT or self.lr_decay_rounds == 0:
            return self.lr
        return cosine_lr(self.lr, round_, self.lr_decay_rounds)

    def sample_rate(self, num_examples: int) -> float:
        """q: ``shared_sample_rate`` when set, else lot_size / N capped at 1 (a lot may not
        exceed the data set)."""
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")
        if self.shared_sample_rate is not None:
            return self.shared_sample_rate
        return min(1.0, self.lot_size / num_examples)

    def steps_per_round(self, num_examples: int) -> int:
        """``local_epochs × steps_per_epoch(q)`` DP-SGD steps in one round."""
        return self.local_epochs * steps_per_epoch(self.sample_rate(num_examples))

    def round_events(self, num_examples: int) -> tuple[DpEvent, ...]:
        """The events one round spends on N examples: what a server books *before* it
        asks, and exactly what ``train_round`` reports afterwards."""
        q = self.sample_rate(num_examples)
        return (dpsgd_event(self.noise_multiplier, q, self.steps_per_round(num_examples)),)

    def dpsgd_config(self, num_examples: int, physical_batch: int | None = None) -> DPSGDConfig:
        """The engine's config for a local data set of ``num_examples``; its micro-batches
        hold ``max_physical_batch_size`` examples or, where the plan leaves that open (None),
        ``physical_batch``."""
        size = physical_batch if self.max_physical_batch_size is None else self.max_physical_batch_size
        if size is None:
            raise ValueError("the plan leaves the physical batch open: pass physical_batch (with_physical_batch)")
        return DPSGDConfig(
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            sample_rate=self.sample_rate(num_examples),
            max_physical_batch_size=size,
            clipping=self.clipping,
        )

    def non_private(self) -> TrainingPlan:
        """The same schedule without clipping or noise (σ = 0, C = ∞)."""
        return dataclasses.replace(self, noise_multiplier=0.0, max_grad_norm=math.inf)


# Tuned on MNIST (docs/baselines.md): Tramèr & Boneh 2021's ScatterNet+linear, large
# lots, small C, high LR with momentum. σ is calibrated per run (calibrate_plan).
_DEFAULT_PLANS: dict[str, TrainingPlan] = {
    "mnist": TrainingPlan(model="scatter_linear", lot_size=4096, max_grad_norm=0.1, noise_multiplier=1.0,
                          lr=4.0),
    "cifar10": TrainingPlan(model="cifar_cnn", lot_size=1024, max_grad_norm=0.1, noise_multiplier=1.0, lr=4.0,
                            lr_schedule=LRSchedule.COSINE),
}


def default_plan(dataset: str, **overrides: Any) -> TrainingPlan:
    """The data set's defaults (σ to be calibrated) with ``overrides`` of plan fields; an
    override of ``None`` keeps the default (an unset flag or run-config key)."""
    if dataset not in _DEFAULT_PLANS:
        raise ValueError(f"no default plan for {dataset!r}; choose one of {', '.join(_DEFAULT_PLANS)}")
    chosen = {name: value for name, value in overrides.items() if value is not None}
    return dataclasses.replace(_DEFAULT_PLANS[dataset], **chosen)


def default_epochs(dataset: str, target_epsilon: float | None) -> int:
    """Default number of epochs (= rounds of one local epoch): fewer for smaller ε, where
    the noise that more steps require outweighs the extra optimisation."""
    if target_epsilon is None or target_epsilon >= 2:
        return 40
    return 20 if target_epsilon >= 1 else 10


def calibrate_plan(
    plan: TrainingPlan, target_epsilon: float, delta: float, num_examples: int, rounds: int,
    prior_events: Sequence[DpEvent] = (),
) -> TrainingPlan:
    """``plan`` with the smallest σ (RDP) whose ε after ``rounds`` rounds, composed with
    ``prior_events`` (a client's released count), is ≤ target.

    Total steps = rounds × ``plan.steps_per_round(num_examples)`` at ``plan.sample_rate(N)``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sigma = calibrate_noise_multiplier(
        target_epsilon, delta, plan.sample_rate(num_examples), rounds * plan.steps_per_round(num_examples),
        prior_events=prior_events,
    )
    return dataclasses.replace(plan, noise_multiplier=sigma)


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_STEP_MEMORY: dict[tuple[Any, ...], StepMemory] = {}


def with_physical_batch(
    plan: TrainingPlan, model: nn.Module, features: torch.Tensor, device: torch.device | str, secure: bool = False,
    fit: bool = False,
) -> TrainingPlan:
    """``plan`` with a physical batch: its own, or the largest whose measured step (with the
    plan's model, optimizer and clipping; ``secure``: the CSPRNG's noise) fits
    ``device_budget(device)``, at most ``len(features)``. With ``fit``, the plan's own is only
    an upper bound (a request from a server, which knows nothing of this device): the
    smaller of the two. ``model`` is on ``device``; its step memory is measured once per
    process for each kind of step."""
    requested = plan.max_physical_batch_size
    if requested is not None and not fit:
        return plan
    device = torch.device(device)
    config = dataclasses.replace(plan.dpsgd_config(len(features), physical_batch=1), secure_mode=secure)
    sample_shape = tuple(features.shape[1:])
    key = (plan.model, plan.optimizer, plan.momentum > 0, probe_config(config), sample_shape, features.dtype, device)
    if key not in _STEP_MEMORY:
        _STEP_MEMORY[key] = measure_step_memory(
            model, sample_shape, config, optimizer=lambda m: make_optimizer(m, plan, 1), dtype=features.dtype
        )
    size = fit_batch(_STEP_MEMORY[key], device_budget(device), max_batch=len(features))
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
    seed: int,
    client: int,
    round_: int,
    device: torch.device | str,
    progress: bool = False,
    secure: bool = False,
    num_examples: int | None = None,
    fit_physical_batch: bool = False,
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
    """
    if num_examples is None:
        num_examples = len(labels)
    elif not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples < 1:
        raise ValueError(f"num_examples must be an integer >= 1, got {num_examples!r}")
    device = torch.device(device)
    model.to(device)
    features, labels = features.to(device), labels.to(device)
    config = with_physical_batch(plan, model, features, device, secure, fit_physical_batch).dpsgd_config(num_examples)
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
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch_size: int = 4096
) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on the data, in batches, without grad."""
    if len(labels) == 0:
        raise ValueError("cannot evaluate on an empty data set")
    model.eval()
    device = next(model.parameters()).device
    loss, correct = 0.0, 0
    for start in range(0, len(labels), batch_size):
        x = features[start : start + batch_size].to(device)
        y = labels[start : start + batch_size].to(device)
        logits = model(x)
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(dim=1) == y).sum().item()
    return loss / len(labels), correct / len(labels)


def model_sha256(model: nn.Module) -> str:
    """SHA-256 of the state dict's tensors as float32 bytes, in state-dict order."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
