"""The events of user-level DP-FedAvg (McMahan et al. 2018) with adaptive clipping (Andrew,
Thakkar, McMahan, Ramaswamy 2021), and how its noise is split.

One round: clients are Poisson-sampled at rate q; each sampled client's model delta is
clipped to S; the sum gets N(0, (z_Δ S)²) per coordinate. With adaptive clipping the
clients' bits b = 1[‖Δ‖ ≤ S], centred (b − ½, sensitivity ½), are summed with N(0, σ_b²).
A client's removal moves the delta sum by ≤ S and the centred count by ≤ ½: the two
Gaussians compose to one of multiplier z with z⁻² = z_Δ⁻² + (2σ_b)⁻², so a round is
exactly ``PoissonSampledEvent(q, GaussianEvent(z))`` for each client of the population —
sampled or not — and R rounds are ``dpsgd_event(z, q, R)``.

A node that took part books the round against its *records*: one record added or removed
moves its clipped delta anywhere within the S-ball (by ≤ 2S) and its bit by ≤ 1, so the
round is ``GaussianEvent(z / 2)`` to its records (no amplification by the server's
sampling, which the node cannot check); a round it was not sampled in never read them.
"""

from __future__ import annotations

import math

from fedpriv.privacy.events import DpEvent, GaussianEvent, PoissonSampledEvent, check_sample_rate


def user_round_event(sample_rate: float, noise_multiplier: float) -> DpEvent:
    """What one round costs each client of the population, at user level."""
    return PoissonSampledEvent(check_sample_rate(sample_rate), GaussianEvent(noise_multiplier))


def participant_event(noise_multiplier: float) -> DpEvent:
    """What one round a node took part in costs its records (sensitivity 2S, noise zS)."""
    return GaussianEvent(noise_multiplier / 2)


def delta_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the delta sum's share of a round of multiplier z when the
    clipped-count estimate takes noise σ_b (Andrew et al. 2021, Theorem 1); ``ValueError``
    where 2σ_b ≤ z (the count alone would spend the round)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    if not 2 * count_noise > noise_multiplier:
        raise ValueError(f"clip-count-noise {count_noise:g} must exceed half the noise multiplier "
                         f"({noise_multiplier:g} / 2): the count estimate would spend the whole round")
    return (noise_multiplier**-2 - (2 * count_noise) ** -2) ** -0.5
