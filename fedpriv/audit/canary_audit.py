"""One DP-SGD audit's settings (``CanaryAudit``): the canaries, the claim it checks (target
ε, δ, q, epochs, C), the mode's clients, the parts to run and the negative controls
(``unsafe_noise_multiplier``, an injected engine ``bug``); and what an audit refuses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedpriv.audit.bugs import NO_BUG, EngineBug
from fedpriv.audit.one_run import DEFAULT_CONFIDENCE
from fedpriv.audit.steps import DEFAULT_ALPHA, StepAudit
from fedpriv.dpsgd import steps_per_epoch
from fedpriv.privacy import calibrate_noise_multiplier

PARTS = frozenset({"one-run", "white-box"})
"""The audit's parts: the one-run canary audit, the white-box step audit (``steps``)."""

Progress = Callable[[str], None]
"""Where long work reports how far it got (the command: a line on stderr)."""


class NotAvailableError(ValueError):
    """An audit fedpriv does not have: a canary type its mode's adversary cannot score."""


@dataclass(frozen=True)
class CanaryAudit:
    """One audit's settings.  ``clients`` None: centralized; else K federated clients.
    ``canary_type``: "gradient" (white box, ``CanaryModel``) or "input" (mislabelled noise
    images, scored by their loss on the final model: black box, weak)."""

    canaries: int = 1000
    target_epsilon: float = 2.0
    delta: float = 1e-5
    clients: int | None = None
    model: str = "cnn"
    dataset: str = "mnist"
    train_size: int = 1000
    sample_rate: float = 0.1
    epochs: int = 5
    max_grad_norm: float = 1.0
    lr: float = 0.05
    max_physical_batch_size: int = 256
    seed: int = 0
    data_dir: str | None = None
    unsafe_noise_multiplier: float | None = None
    canary_type: str = "gradient"
    confidence: float = DEFAULT_CONFIDENCE
    parts: frozenset[str] = PARTS
    step_canaries: int = 64
    step_alpha: float = DEFAULT_ALPHA
    bug: EngineBug = NO_BUG

    def __post_init__(self) -> None:
        if self.canaries < 2:
            raise ValueError(f"canaries must be >= 2, got {self.canaries}")
        if self.clients is not None and self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if not self.parts or not self.parts <= PARTS:
            raise ValueError(f"parts must be a non-empty subset of {sorted(PARTS)}, got {sorted(self.parts)}")
        if self.canary_type not in ("gradient", "input"):
            raise ValueError(f"canary_type must be 'gradient' or 'input', got {self.canary_type!r}")
        if self.unsafe_noise_multiplier is not None and self.unsafe_noise_multiplier < 0:
            raise ValueError(f"unsafe_noise_multiplier must be >= 0, got {self.unsafe_noise_multiplier}")

    @property
    def steps(self) -> int:
        """Steps each party takes in all: E epochs (rounds of one local epoch) at q."""
        return self.epochs * steps_per_epoch(self.sample_rate)

    def noise_multiplier(self) -> float:
        """The calibrated σ: the one the accountant books."""
        return calibrate_noise_multiplier(self.target_epsilon, self.delta, self.sample_rate, self.steps)

    def trained_noise_multiplier(self, booked: float) -> float:
        return booked if self.unsafe_noise_multiplier is None else self.unsafe_noise_multiplier

    def step_audit(self, booked: float, batch: int, clients: int | None) -> StepAudit:
        """The white-box step audit of this run's claim (σ booked, C; ``clients`` None: the
        engine's step, else distributed mode's), with its negative controls:
        ``unsafe_noise_multiplier`` as a noise scale, and ``bug``."""
        trained = self.trained_noise_multiplier(booked) / booked
        bug = EngineBug(self.bug.noise_scale * trained, self.bug.clip_scale)
        return StepAudit(noise_multiplier=booked, max_grad_norm=self.max_grad_norm, canaries=self.step_canaries,
                         batch=batch, alpha=self.step_alpha, seed=self.seed, model=self.model, lr=self.lr,
                         max_physical_batch_size=self.max_physical_batch_size, bug=bug, clients=clients)
