"""NEGATIVE CONTROLS for the audits: the DP-SGD engine with a noise or a clipping bug,
made by wrapping its inputs, never by changing its code path.

``EngineBug(noise_scale, clip_scale)`` turns an honest ``DPSGDConfig`` into one whose noise
is ``noise_scale`` × the claimed σ·C (a noise bug: 0.5 is σ/2) and whose examples are
clipped to ``clip_scale`` × C while the noise stays σ·C for the claimed C (a clipping bug:
2 is 2C). ``train_dpsgd`` reads exactly ``config.noise_std`` for its noise and
``config.max_grad_norm`` for its clipping, so the engine runs its own code on the buggy
values; the accountant, the calibration and the claim keep the honest σ and C.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fedpriv.dpsgd import DPSGDConfig
from fedpriv.training import TrainingPlan


@dataclass(frozen=True)
class _BuggyConfig(DPSGDConfig):
    """A config whose clipping bound is ``max_grad_norm`` but whose noise is drawn for
    ``claimed_clip``, scaled by ``noise_scale``."""

    claimed_clip: float = 1.0
    noise_scale: float = 1.0

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.claimed_clip * self.noise_scale


@dataclass(frozen=True)
class _BuggyPlan(TrainingPlan):
    """A plan whose engine configs carry ``bug`` (federated local mode trains from plans)."""

    bug: EngineBug | None = None

    def dpsgd_config(self, num_examples: int, physical_batch: int | None = None) -> DPSGDConfig:
        config = super().dpsgd_config(num_examples, physical_batch)
        return config if self.bug is None else self.bug.config(config)


@dataclass(frozen=True)
class EngineBug:
    """The bug injected: noise × ``noise_scale``, clipping bound × ``clip_scale``."""

    noise_scale: float = 1.0
    clip_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_scale) and self.noise_scale >= 0):
            raise ValueError(f"noise_scale must be finite and >= 0 (0: no noise), got {self.noise_scale!r}")
        if not (math.isfinite(self.clip_scale) and self.clip_scale > 0):
            raise ValueError(f"clip_scale must be finite and > 0, got {self.clip_scale!r}")

    @property
    def active(self) -> bool:
        return self.noise_scale != 1 or self.clip_scale != 1

    def describe(self) -> str:
        parts = ([f"noise × {self.noise_scale:g}"] if self.noise_scale != 1 else []) + \
            ([f"clipping bound × {self.clip_scale:g}"] if self.clip_scale != 1 else [])
        return ", ".join(parts) or "none"

    def config(self, config: DPSGDConfig) -> DPSGDConfig:
        """``config`` with this bug (itself when there is none)."""
        if not self.active:
            return config
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(DPSGDConfig)}
        fields["max_grad_norm"] = config.max_grad_norm * self.clip_scale
        return _BuggyConfig(**fields, claimed_clip=config.max_grad_norm, noise_scale=self.noise_scale)

    def plan(self, plan: TrainingPlan) -> TrainingPlan:
        """``plan`` whose engine configs carry this bug (itself when there is none)."""
        if not self.active:
            return plan
        return _BuggyPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(TrainingPlan)}, bug=self)


NO_BUG = EngineBug()
