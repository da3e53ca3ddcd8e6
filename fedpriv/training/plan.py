"""A training plan: how one party trains locally in one round, what that round costs, and
the defaults and σ calibration that choose it.

The plan is the one description a server sends and a node (or the centralized run) trains
by: the LR is a function of the round only and nothing else carries across rounds, so a
single-client federation with one local epoch per round reproduces the centralized run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fedpriv.dpsgd import Clipping, DPSGDConfig, steps_per_epoch
from fedpriv.model_names import MODELS, TASK_MODEL
from fedpriv.privacy import calibrate_noise_multiplier, dpsgd_event
from fedpriv.privacy.events import DpEvent


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
    ``clipping`` also takes its string value; ``__post_init__`` stores the engine's parse.
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
    clipping: Clipping = Clipping.FLAT
    lr_schedule: LRSchedule | str = LRSchedule.CONSTANT
    lr_decay_rounds: int = 0
    shared_sample_rate: float | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS and self.model != TASK_MODEL:
            raise ValueError(f"model must be one of {', '.join(MODELS)} (or {TASK_MODEL!r}: a user's task), "
                             f"got {self.model!r}")
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
    # A user's task (fedpriv.task): generic defaults, which its app's run config overrides.
    TASK_MODEL: TrainingPlan(model=TASK_MODEL, lot_size=256, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.5),
}


def default_plan(dataset: str, **overrides: Any) -> TrainingPlan:
    """The data set's defaults (σ to be calibrated) with ``overrides`` of plan fields; an
    override of ``None`` keeps the default (an unset flag or run-config key)."""
    if dataset not in _DEFAULT_PLANS:
        raise ValueError(f"no default plan for {dataset!r}; choose one of {', '.join(_DEFAULT_PLANS)}")
    chosen = {name: value for name, value in overrides.items() if value is not None}
    return dataclasses.replace(_DEFAULT_PLANS[dataset], **chosen)


SIZE_CAP = 4.0
"""A client's N counts at most this many times the lower median of the clients' sizes, in
the shared lot's ΣN and as a FedAvg weight (a released N is untrusted: ``server.assign``)."""


def size_cap(sizes: Sequence[int]) -> float:
    """``SIZE_CAP`` × the lower median of ``sizes`` (∞ without any)."""
    ordered = sorted(sizes)
    return SIZE_CAP * ordered[(len(ordered) - 1) // 2] if ordered else math.inf


def shared_plan(plan: TrainingPlan, sizes: Sequence[int]) -> TrainingPlan:
    """``plan`` with its lot shared out among clients of ``sizes``: every client samples at
    q = lot_size / Σ min(N, cap), capped at 1 (the server's default, ``server.assign``)."""
    cap = size_cap(sizes)
    total = sum(min(n, cap) for n in sizes)
    return dataclasses.replace(plan, shared_sample_rate=min(1.0, plan.lot_size / total))


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
