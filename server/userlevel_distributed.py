"""Distributed user-level DP-FedAvg (``privacy = "user"``, ``user-noise = "distributed"``):
whole clients protected, and the noise added by the clients under secure aggregation, so
the server sees only the noisy sum (``docs/user-level.md``).

As central user level (``server.userlevel``): the population ledger books every client of
P each round before anything is sent, the cohort is Poisson at q = cohort / population,
and the model moves by the decoded sum divided by the expected cohort m = q·|P|. What
differs:

- the cohort's deltas, clipped to S, are encoded on one lattice for the run
  (``fedpriv.distributed.setup.user_level_lattice``: scale, rounding and modulus as
  distributed mode picks them) and summed by SecAgg+ (``server.secure_sum``); each node adds
  its discrete Gaussian share (``clients.userlevel_distributed``);
- the population ledger books ``distributed_user_round_event``: the nominal shares
  n = max(1, ⌊m⌋) that together carry z·S·scale, on the encoding's sensitivity Δ₂ (so z·c/Δ₂
  is the round's Gaussian multiplier: the rounding's inflation is paid, not ignored); with
  ``target-epsilon`` z is calibrated on that event;
- a round with no cohort, or whose secure sum fails (too few survivors, a node's refusal),
  is discarded: without the nodes' shares there is no noise, so nothing is stepped.

Adaptive clipping: the bit rides in the same secure sum as one more coordinate,
(2b − 1)·k (``fedpriv.privacy.userlevel.count_scale``), under the same shares, whose noise
z_Δ·S·scale is σ_b on the centred count: Andrew et al.'s split, and the round one event of
sensitivity √(Δ₂² + k²) on d + 1 coordinates. S changes each round, and with it the lattice
and the event booked (so z is given, not calibrated: ``RunSettings`` refuses
``target-epsilon`` here). A count-only round (``clip-warmup-rounds``) securely sums one
coordinate, (2b − 1)·k for k = ``COUNT_ONLY_SCALE`` (``count_only_lattice``), booked
``distributed_count_round_event`` for the nominal shares; S steps, the model stays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import Array, ArrayRecord
from flwr.supercore import log

from fedpriv.distributed.lattice import Lattice
from fedpriv.distributed.setup import count_only_lattice, user_level_lattice
from fedpriv.federation import protocol, userlevel
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy.calibration import calibrate_distributed_noise
from fedpriv.privacy.events import DpEvent
from fedpriv.privacy.userlevel import (
    COUNT_ONLY_SCALE,
    count_scale,
    distributed_count_round_event,
    distributed_user_round_event,
)
from server.assign import Assignment
from server.collect import SecureSum
from server.mechanism import Booking, Collected, Round
from server.userlevel import UserLevel


class DistributedUserLevel(UserLevel):
    """User-level DP-FedAvg whose noise the cohort adds under secure aggregation: central
    user level's booking, cohort and S, with its own events, lattice, collection and update."""

    def __init__(self, settings: RunSettings, nodes: Mapping[int, Assignment], *, dimension: int,
                 **kwargs: Any) -> None:
        self.dimension, self.rounding = dimension, settings.lattice_rounding
        self.lattice: Lattice | None = None
        super().__init__(settings, nodes, **kwargs)
        self.collector = SecureSum(self.round_lattice, settings.secagg_neighbours)

    @property
    def nominal_shares(self) -> int:
        """The shares the population ledger's event splits z·S·scale into: ⌊m⌋, at least 1."""
        return max(1, math.floor(self.expected_cohort))

    def _lattice(self, clip: float, noise_multiplier: float, count_noise: float | None) -> Lattice:
        return user_level_lattice(clip, self.dimension, self.rounding, self.known, noise_multiplier, count_noise)

    @property
    def bit_scale(self) -> int:
        """k of the bit's coordinate (0: fixed clipping, no such coordinate)."""
        if self.count_noise is None:
            return 0
        assert self.lattice is not None
        return count_scale(self.delta_multiplier * self.lattice.clip, self.count_noise)

    def calibrated_noise(self, settings: RunSettings) -> float:
        """z for ``target-epsilon`` after ``rounds`` rounds of the distributed event (the
        modulus, chosen once z is known, does not enter it)."""
        assert settings.target_epsilon is not None
        lattice = self._lattice(settings.user_clip, 0.0, None)  # fixed clipping (RunSettings)
        share = calibrate_distributed_noise(settings.target_epsilon, settings.delta, self.sample_rate,
                                            settings.rounds, self.nominal_shares, lattice.sensitivity, self.dimension)
        return share * math.sqrt(self.nominal_shares) / lattice.clip

    def round_event(self) -> DpEvent:
        """For the current S: Poisson q of the nominal shares, summing to z_Δ·S·scale, on
        sensitivity Δ₂ (√(Δ₂² + k²) with the bit's coordinate)."""
        self.lattice = self._lattice(self.clip, self.delta_multiplier, self.count_noise)
        return distributed_user_round_event(
            self.sample_rate, self.lattice.noise_stddev(self.delta_multiplier, self.nominal_shares),
            self.nominal_shares, math.hypot(self.lattice.sensitivity, self.bit_scale), self.lattice.dimension)

    def booked_event(self, server_round: int) -> DpEvent:
        """The round's population event: the count's alone in a count-only round."""
        if self.count_only(server_round):
            assert self.count_noise is not None
            return distributed_count_round_event(self.sample_rate, self.count_noise, self.nominal_shares)
        return self.event

    def book(self, booking: Booking) -> list[int]:
        """This round's S fixes its lattice and event; then central user level's booking."""
        self.known = len(booking.nodes)
        self.event = self.round_event()
        return super().book(booking)

    def round_lattice(self, rnd: Round) -> Lattice:
        """The lattice the round's vectors are summed on: the count's alone in a count-only round."""
        if self.count_only(rnd.number):
            assert self.count_noise is not None
            return count_only_lattice(self.known, self.count_noise)
        assert self.lattice is not None
        return self.lattice

    def resolved(self) -> dict[str, Any]:
        """Central user level's, with the noise's origin and the lattice."""
        resolved = super().resolved()
        assert self.lattice is not None
        resolved["user_level"] |= {
            "user_noise": "distributed", "nominal_shares": self.nominal_shares, "lattice_scale": self.lattice.scale,
            "dimension": self.dimension, "sensitivity": self.lattice.sensitivity,
            "sensitivity_inflation": self.lattice.sensitivity / self.lattice.clip,
            "modulus_bits": self.lattice.modulus_bits, "lattice_rounding": str(self.lattice.rounding),
            "node_event": "DistributedDiscreteGaussianEvent(z_Δ·S·scale/√n, n, 2√(Δ₂² + k²), d (+ 1)) per round "
                          "taken part in, n = the node's min-cohort − max-dropouts − max-colluders"}
        return resolved

    def train_config(self, rnd: Round, assignment: Assignment) -> dict[str, Any]:
        """S and z (and σ_b when adaptive), and the lattice the round's vectors are on."""
        lattice = self.round_lattice(rnd)
        count = {} if self.count_noise is None else {userlevel.COUNT_NOISE: self.count_noise}
        return {**super().train_config(rnd, assignment), **count, protocol.LATTICE_SCALE: lattice.scale,
                protocol.MODULUS_BITS: lattice.modulus_bits, protocol.LATTICE_ROUNDING: str(lattice.rounding)}

    def update(self, rnd: Round, collected: Collected) -> ArrayRecord | None:
        """The model moved by the decoded sum / m (S's step from the bit's coordinate); a
        count-only round steps S alone. Without a sum there are no noise shares: nothing moves."""
        if collected.decoded is None:
            rnd.log.discarded = f"{collected.reason}; no noise shares to release: the previous model is kept"
            log(WARNING, "Round %d: %s", rnd.number, rnd.log.discarded)
            return None
        expected, lattice = self.expected, self.round_lattice(rnd)
        log(INFO, "Round %d: secure sum of %d of %d clients, divided by the expected cohort %.1f",
            rnd.number, len(collected.survivors), len(rnd.cohort), expected)
        flat = collected.decoded.numpy()
        if self.count_only(rnd.number):  # Σ(2b − 1)·k + noise: S steps, the model stays
            rnd.log.train_metrics["count_only"] = 1
            self.adapt_clip(float(flat[0]) / (2 * COUNT_ONLY_SCALE), rnd.log, self.warmup_lr)
            return None
        if self.count_noise is not None:  # the last coordinate: Σ(2b − 1)·k + noise, in lattice units / scale
            bit_scale, flat = self.bit_scale, flat.copy()
            self.adapt_clip(float(flat[-1]) * lattice.scale / (2 * bit_scale), rnd.log, self.clip_lr)
            flat = flat[:-1]
        mean, out, offset = flat / expected, {}, 0
        for name, array in rnd.arrays.items():
            values = array.numpy()
            part = mean[offset:offset + values.size].reshape(values.shape)
            offset += values.size
            out[name] = Array((values.astype(mean.dtype) + part).astype(values.dtype))
        return ArrayRecord(out)
