"""DP-SGD settings: one frozen, validated config, plus the schedule helpers around it.

Invariants checked here, once, at the edge:
- ``noise_multiplier`` σ ≥ 0 and finite; ``max_grad_norm`` C > 0 (``inf`` only with σ = 0,
  which is the non-private schedule: same Poisson lots, no clipping, no noise);
- ``sample_rate`` q in [``MIN_SAMPLE_RATE``, 1], the rates the Poisson samplers draw
  faithfully (``check_sample_rate``); ``max_physical_batch_size`` ≥ 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fedpriv.privacy import events


class Clipping(StrEnum):
    """How each example's gradient is bounded.

    ``FLAT``: the whole gradient (all parameter tensors together) to L2 norm ≤ C.
    ``PER_LAYER``: each of the K trainable parameter tensors (a weight and its bias are two)
    to ≤ C/√K, so the whole gradient is still ≤ C and the privacy event is unchanged.
    The DP-dropout paper clips every layer at C; that is ``max_grad_norm = C·√K`` here.
    """

    FLAT = "flat"
    PER_LAYER = "per_layer"


class GradSampleMode(StrEnum):
    """How per-example gradients are obtained; all modes give the same clipped sum.

    ``VMAP``: ``torch.func.vmap(grad(...))`` materialises every per-example gradient.
    ``BOOKKEEPING``: one batched forward/backward with hooks; Linear layers get their
    per-example norms without materialising (‖g aᵀ‖ = ‖g‖‖a‖) and their clipped sum as one
    matmul (Bu et al. 2022; ghost clipping, Li et al. 2021); Conv2d / GroupNorm materialise
    their small per-example gradients.  Only for models made of supported layers.
    ``AUTO``: for the non-private schedule (σ = 0, C = ∞), one batched gradient of the summed
    loss (``fedpriv.dpsgd.batch``: nothing per example is needed); otherwise ``BOOKKEEPING``
    when the model supports it, else ``VMAP``.
    """

    AUTO = "auto"
    VMAP = "vmap"
    BOOKKEEPING = "bookkeeping"


class ConfigError(ValueError):
    """A DP-SGD setting is out of range."""


def check_sample_rate(sample_rate: float, name: str = "sample_rate") -> float:
    """``sample_rate`` if the Poisson samplers draw it faithfully, else ``ConfigError``
    (``fedpriv.privacy.events.check_sample_rate``: ``MIN_SAMPLE_RATE`` ≤ q ≤ 1)."""
    return events.check_sample_rate(sample_rate, name, ConfigError)


@dataclass(frozen=True)
class DPSGDConfig:
    """DP-SGD hyper-parameters (Abadi et al. 2016): noise σ, clip norm C, Poisson rate q.

    ``secure_mode``: draw both the Poisson lots and the noise from ``os.urandom`` (a CSPRNG)
    instead of generators (``train_dpsgd`` then takes none); the result is *not
    reproducible*, and slower.  Like Opacus it sums four draws of std σC/2 (same
    distribution) to blunt floating-point attacks on the sampler's low bits (Mironov 2012);
    see ``noise.fill_gaussian_noise_`` and ``sampling.secure_poisson_lot``.
    ``clipping`` and ``grad_sample_mode`` also take their string values (from a CLI or the
    wire): ``__post_init__`` parses them, so the fields always hold the enum.
    """

    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    max_physical_batch_size: int = 512
    clipping: Clipping = Clipping.FLAT
    secure_mode: bool = False
    grad_sample_mode: GradSampleMode = GradSampleMode.AUTO

    def __post_init__(self) -> None:
        _check_number("noise_multiplier", self.noise_multiplier)
        _check_number("max_grad_norm", self.max_grad_norm)
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise ConfigError(f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}")
        if not self.max_grad_norm > 0:
            raise ConfigError(f"max_grad_norm must be > 0 (inf for no clipping), got {self.max_grad_norm!r}")
        if math.isinf(self.max_grad_norm) and self.noise_multiplier != 0:
            raise ConfigError("max_grad_norm=inf needs noise_multiplier=0: noise σ·C would be infinite")
        check_sample_rate(self.sample_rate)
        size = self.max_physical_batch_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"max_physical_batch_size must be an integer >= 1, got {size!r}")
        object.__setattr__(self, "clipping", _parse(Clipping, "clipping", self.clipping))
        object.__setattr__(
            self, "grad_sample_mode", _parse(GradSampleMode, "grad_sample_mode", self.grad_sample_mode)
        )

    @property
    def noise_std(self) -> float:
        """Standard deviation σ·C of the noise added to the *sum* of clipped gradients."""
        return 0.0 if self.noise_multiplier == 0 else self.noise_multiplier * self.max_grad_norm

    @classmethod
    def for_target_epsilon(
        cls,
        target_epsilon: float,
        delta: float,
        *,
        steps: int,
        sample_rate: float,
        max_grad_norm: float,
        accountant: str = "rdp",
        **options: Any,
    ) -> DPSGDConfig:
        """The config whose σ is the smallest reaching ``target_epsilon`` at ``delta`` after
        ``steps`` steps (use ``epochs * steps_per_epoch(sample_rate)``); train exactly that
        many steps.  σ comes from ``fedpriv.privacy.calibrate_noise_multiplier``, which
        searches the same ``dpsgd_event`` that training reports."""
        from fedpriv.privacy import calibrate_noise_multiplier

        sigma = calibrate_noise_multiplier(target_epsilon, delta, sample_rate, steps, accountant=accountant)
        return cls(noise_multiplier=sigma, max_grad_norm=max_grad_norm, sample_rate=sample_rate, **options)


def steps_per_epoch(sample_rate: float) -> int:
    """Lots per epoch: an epoch sees N examples and a lot holds q·N in expectation, so
    ``round(1/q)`` (at least 1)."""
    return max(1, round(1 / check_sample_rate(sample_rate)))


def _check_number(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")


def _parse(enum: type[StrEnum], name: str, value: object) -> Any:
    if isinstance(value, str):  # an enum member is a str; a non-str matches no member
        try:
            return enum(value)
        except ValueError:
            pass
    choices = ", ".join(repr(m.value) for m in enum)
    raise ConfigError(f"{name} must be one of {choices}, got {value!r}")
