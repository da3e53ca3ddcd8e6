"""What a central user-level round adds to the protocol (``docs/user-level.md``).

- TRAIN: the usual "arrays" and "config" (the local-training plan, ``server-round``,
  ``run-key``) plus ``user-clip`` (S, this round's bound on the delta) and
  ``user-noise-multiplier`` (z, the round's whole noise multiplier, which the server says it
  adds: the node books ``participant_event(z)``); with distributed noise and adaptive
  clipping also ``clip-count-noise`` (σ_b, which fixes the bit's share of the noise).
- count-only TRAIN (``clip-warmup-rounds``): also ``count-only`` = true and
  ``clip-count-noise``; the node books ``count_participant_event(σ_b)`` and its reply has no
  "arrays": only "privacy" and the bit.
- TRAIN reply: "arrays" holds the clipped model *delta* (not the model), "privacy" the
  charge, and the ``MetricRecord`` "user" the bit ``under-clip`` = 1[‖Δ‖ ≤ S] that adaptive
  clipping counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedpriv.federation.protocol import ProtocolError, is_finite_number

USER_CLIP = "user-clip"
USER_NOISE = "user-noise-multiplier"
USER = "user"
UNDER_CLIP = "under-clip"
COUNT_NOISE = "clip-count-noise"
COUNT_ONLY = "count-only"


def user_round_config(clip: float, noise_multiplier: float) -> dict[str, float]:
    """The keys a user-level TRAIN adds to the plan's."""
    return {USER_CLIP: clip, USER_NOISE: noise_multiplier}


def read_count_noise(config: Mapping[str, Any]) -> float | None:
    """σ_b of a distributed user-level round with adaptive clipping (None: fixed clipping);
    ``ProtocolError`` unless finite and > 0."""
    value = config.get(COUNT_NOISE)
    if value is None:
        return None
    if not is_finite_number(value) or not value > 0:
        raise ProtocolError(f"'{COUNT_NOISE}' must be finite and > 0, got {value!r}")
    return float(value)


def read_count_only(config: Mapping[str, Any]) -> float | None:
    """σ_b of a count-only TRAIN, or ``None`` for a round that releases the delta;
    ``ProtocolError`` unless ``count-only`` is a bool and, when true, σ_b is valid."""
    flag = config.get(COUNT_ONLY, False)
    if not isinstance(flag, bool):
        raise ProtocolError(f"'{COUNT_ONLY}' must be a bool, got {flag!r}")
    if not flag:
        return None
    count_noise = read_count_noise(config)
    if count_noise is None:
        raise ProtocolError(f"a count-only round needs '{COUNT_NOISE}'")
    return count_noise


def read_user_round(config: Mapping[str, Any]) -> tuple[float, float]:
    """(S, z) of a user-level TRAIN; ``ProtocolError`` unless both are finite and > 0."""
    values = []
    for key in (USER_CLIP, USER_NOISE):
        value = config.get(key)
        if not is_finite_number(value) or not value > 0:
            raise ProtocolError(f"a user-level round needs '{key}' finite and > 0, got {value!r}")
        values.append(float(value))
    return values[0], values[1]
