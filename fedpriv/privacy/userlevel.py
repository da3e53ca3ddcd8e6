"""The events of user-level DP-FedAvg (McMahan et al. 2018) with adaptive clipping (Andrew,
Thakkar, McMahan, Ramaswamy 2021), and how its noise is split.

One round: clients are Poisson-sampled at rate q; each sampled client's model delta is
clipped to S; the sum gets N(0, (z_Δ S)²) per coordinate. With adaptive clipping the
clients' bits b = 1[‖Δ‖ ≤ S], centred (b − ½, sensitivity ½), are summed with N(0, σ_b²).
A client's removal moves the delta sum by ≤ S and the centred count by ≤ ½: the two
Gaussians compose to one of multiplier z with z⁻² = z_Δ⁻² + (2σ_b)⁻², so a round is
exactly ``PoissonSampledEvent(q, GaussianEvent(z))`` for each client of the population —
sampled or not — and R rounds are ``dpsgd_event(z, q, R)``.

**Count-only rounds** (``clip-warmup-rounds``: S placed before the model moves): the sampled
clients release only Σ(b − ½) + N(0, σ_b²). A client's removal moves it by ≤ ½, so the round
is ``count_round_event(q, σ_b)`` = ``PoissonSampledEvent(q, GaussianEvent(2σ_b))``; a record
changed flips at most its node's bit (by ≤ 1): ``count_participant_event(σ_b)`` =
``GaussianEvent(σ_b)``.

With distributed noise a count-only round is a secure sum of one coordinate, (2b − 1)·k for
k = ``COUNT_ONLY_SCALE``, each node adding a discrete Gaussian share of std 2σ_b·k/√n for
the n honest shares its policy guarantees (``count_share_stddev``): n shares carry 2σ_b·k,
i.e. σ_b on Σ(b − ½). A client's removal moves the coordinate by k, a record's change by 2k.

A node that took part books the round against its *records*: one record added or removed
moves its clipped delta anywhere within the S-ball (by ≤ 2S) and its bit by ≤ 1, so the
round is ``GaussianEvent(z / 2)`` to its records (no amplification by the server's
sampling, which the node cannot check); a round it was not sampled in never read them.

**Distributed noise** (``user-noise = "distributed"``): each sampled client encodes its
clipped delta on an integer lattice (scale γ: norm ≤ c = S·γ, rounded to norm ≤ Δ₂, the
rounding's inflation Δ₂/c) and adds a discrete Gaussian share; secure aggregation reveals
only the sum. The population's round is ``distributed_user_round_event``: Poisson q, n
shares whose sum carries z·c, on sensitivity Δ₂ — Gaussian(z·c/Δ₂) on a fine lattice.
A participant's records: its encoded delta moves by ≤ 2Δ₂ under a record change, against
the n shares its own policy guarantees (``distributed_participant_event``).

With adaptive clipping the centred bit rides in the same vector as one more coordinate,
(2b − 1)·k for the integer k = ``count_scale``(z_Δ·c, σ_b): the shares' noise z_Δ·c on it is
2σ_b·k, i.e. σ_b on Σ(b − ½), Andrew et al.'s split. A client's removal moves the vector
by ≤ √(Δ₂² + k²) (a record's change by twice that), so the events take that sensitivity
and d + 1 coordinates; their multiplier z_Δ·c/√(Δ₂² + k²) is z up to Δ₂/c and k's rounding.
"""

from __future__ import annotations

import math

from fedpriv.privacy.accountants import AccountantKind
from fedpriv.privacy.calibration import calibrate_noise_multiplier
from fedpriv.privacy.events import (
    DistributedDiscreteGaussianEvent,
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    check_sample_rate,
)


def count_noise(given: float | None, expected_cohort: float, noise_multiplier: float | None) -> float:
    """σ_b of the count: ``given`` (``clip-count-noise``), else max(m/20, z) — Andrew et al.'s
    m/20, at least z so small cohorts keep z_Δ ≤ 1.16 z; m/20 while z is being calibrated
    (``noise_multiplier`` None), never more than the σ_b then booked."""
    return given or max(expected_cohort / 20, noise_multiplier or 0.0)


def calibrate_user_noise(target_epsilon: float, delta: float, sample_rate: float, rounds: int,
                         count_rounds: int, count_prior_noise: float,
                         accountant: AccountantKind | str = AccountantKind.RDP) -> float:
    """z for ``target_epsilon`` after ``count_rounds`` count-only rounds (``count_round_event``
    at σ_b = ``count_prior_noise``) and ``rounds`` − ``count_rounds`` rounds of
    ``user_round_event(q, z)``: the run's (``server.userlevel``) and the planner's z."""
    prior = (count_round_event(sample_rate, count_prior_noise),) * count_rounds
    return calibrate_noise_multiplier(target_epsilon, delta, sample_rate, rounds - count_rounds, accountant,
                                      prior_events=prior)


def user_round_event(sample_rate: float, noise_multiplier: float) -> DpEvent:
    """What one round costs each client of the population, at user level."""
    return PoissonSampledEvent(check_sample_rate(sample_rate), GaussianEvent(noise_multiplier))


def participant_event(noise_multiplier: float) -> DpEvent:
    """What one round a node took part in costs its records (sensitivity 2S, noise zS)."""
    return GaussianEvent(noise_multiplier / 2)


def count_round_event(sample_rate: float, count_noise: float) -> DpEvent:
    """What one count-only round (the noisy count under S alone) costs each client of the population."""
    return PoissonSampledEvent(check_sample_rate(sample_rate), GaussianEvent(2 * count_noise))


def count_participant_event(count_noise: float) -> DpEvent:
    """What one count-only round a node took part in costs its records (its bit flips: sensitivity 1)."""
    return GaussianEvent(count_noise)


COUNT_ONLY_SCALE = 64
"""k of a distributed count-only round: the bit goes on the lattice as (2b − 1)·k, so that
each discrete share (2σ_b·k/√n) is many lattice steps wide."""


def count_share_stddev(count_noise: float, shares: int) -> float:
    """One of ``shares`` discrete Gaussian shares that together put σ_b on Σ(b − ½) in a
    distributed count-only round: 2σ_b·k/√n lattice units."""
    return 2 * count_noise * COUNT_ONLY_SCALE / math.sqrt(shares)


def distributed_count_round_event(sample_rate: float, count_noise: float, shares: int) -> DpEvent:
    """What one distributed count-only round costs each client of the population: Poisson q of
    ``shares`` shares of ``count_share_stddev`` on one coordinate, sensitivity k."""
    return distributed_user_round_event(sample_rate, count_share_stddev(count_noise, shares), shares,
                                        COUNT_ONLY_SCALE, 1)


def distributed_count_participant_event(count_noise: float, shares: int) -> DpEvent:
    """What one distributed count-only round a node took part in costs its records (its
    ``shares`` honest shares; a record flips the bit: the coordinate moves by 2k)."""
    return distributed_participant_event(count_share_stddev(count_noise, shares), shares, COUNT_ONLY_SCALE, 1)


def distributed_user_round_event(sample_rate: float, noise_stddev: float, shares: int, sensitivity: float,
                                 dimension: int) -> DpEvent:
    """What one round costs each client of the population when ``shares`` discrete Gaussian
    shares of std ``noise_stddev`` (lattice units) noise the sum of encoded deltas, each of
    norm ≤ ``sensitivity`` (Δ₂) in Z^``dimension``: a client's removal moves the sum by ≤ Δ₂."""
    return PoissonSampledEvent(check_sample_rate(sample_rate),
                               DistributedDiscreteGaussianEvent(noise_stddev, shares, sensitivity, dimension))


def distributed_participant_event(noise_stddev: float, shares: int, sensitivity: float, dimension: int) -> DpEvent:
    """What one distributed round a node took part in costs its records: a record changed
    moves its encoded delta within the Δ₂-ball (by ≤ 2Δ₂); ``shares`` honest shares of
    ``noise_stddev`` (its own policy's), no amplification by the server's sampling."""
    return DistributedDiscreteGaussianEvent(noise_stddev, shares, 2 * sensitivity, dimension)


def count_scale(delta_noise_stddev: float, count_noise: float) -> int:
    """k, the integer the centred bit 2b − 1 is multiplied by on the lattice, so that noise of
    std ``delta_noise_stddev`` (z_Δ·c, lattice units) on its coordinate is ``count_noise``
    (σ_b) on Σ(b − ½): k = max(1, round(z_Δ·c / (2σ_b)))."""
    if not (math.isfinite(delta_noise_stddev) and delta_noise_stddev > 0 and math.isfinite(count_noise)
            and count_noise > 0):
        raise ValueError(f"need a finite noise > 0 and clip-count-noise > 0, got {delta_noise_stddev!r}, "
                         f"{count_noise!r}")
    return max(1, round(delta_noise_stddev / (2 * count_noise)))


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
