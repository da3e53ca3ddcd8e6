"""Central user-level DP-FedAvg (McMahan et al. 2018), optionally with adaptive clipping
(Andrew et al. 2021): whole clients protected, the server trusted to add the noise.

Each round, for the population P (the known clients that can still afford it):
1. every client of P is booked ``user_round_event(q, z)`` in the server's (population)
   ledger under ``<run key>/round-<r>/train`` — sampled or not, before anything is sent;
2. each is sampled with probability q = cohort / (population at the start) — Poisson;
3. a sampled client trains with the plain local plan, clips its model delta to S and sends
   it with the bit 1[‖Δ‖ ≤ S] (``clients.userlevel``); its node books ``participant_event(z)``;
4. the server sums the accepted clipped deltas (float64, in client order), adds
   N(0, (z_Δ S)²) per coordinate — always, even to an empty sum — and divides by the
   expected cohort m = q·|P|; the model moves by that mean;
5. with ``clip-quantile`` γ: b̃ = (Σ(b − ½) + N(0, σ_b²)) / m + ½, clamped to [0, 1] (the
   fraction it estimates lies there; clamping is post-processing), and S ← S·exp(−η(b̃ − γ)),
   kept within [S₀/``CLIP_RANGE``, S₀·``CLIP_RANGE``] of the run's ``user-clip`` S₀,
   z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) so the round stays one Gaussian of multiplier z; σ_b is
   ``clip-count-noise``, by default max(m/20, z) (Andrew et al.'s m/20, at least z: small
   cohorts keep z_Δ ≤ 1.16 z).
6. with ``clip-warmup-rounds`` W: rounds 1..W are count-only. Each is booked
   ``count_round_event(q, σ_b)``; the sampled clients train and send only their bit, the
   server releases b̃ alone and steps S with ``clip-warmup-lr``; the model does not move.
   An initial S far too large would otherwise noise the first rounds' mean by z·S/m per
   coordinate and wreck the model before S comes down (``docs/user-level.md``).

Randomness (``server-randomness``): ``secure`` draws the cohort and noise from the OS
CSPRNG; ``seeded`` from one stream per round, ``numpy.random.default_rng(derive_seed(seed,
"user-level", r))``: P uniforms (in client order) for the cohort, then the noise of each
array in the model's order, then the count's.

z is ``noise-multiplier`` or, with ``target-epsilon``, calibrated for the ``rounds`` − W
training rounds at q after the W count-only rounds.

``resume``: the checkpoint keeps S and the population size q is drawn from (``state``);
the per-round draws and the ledger give the rest, so a run stopped after a round and
resumed ends with the uninterrupted run's model and ledgers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.supercore import log

from fedpriv.federation import protocol, userlevel
from fedpriv.federation.settings import RunSettings, ServerRandomness, SettingsError
from fedpriv.federation.userlevel_steps import RoundNoise, noisy_step
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import DpEvent
from fedpriv.privacy.userlevel import (
    calibrate_user_noise,
    count_noise,
    count_participant_event,
    count_round_event,
    delta_noise_multiplier,
    participant_event,
    user_round_event,
)
from server.assign import Assignment
from server.booking import book_population
from server.checks import array_spec
from server.collect import PlainReplies
from server.history import RoundLog, client_order
from server.mechanism import Booking, Collected, Collector, Round
from server.state import StateError


def training_settings(settings: RunSettings) -> RunSettings:
    """The settings the clients' local training is planned from: the plain schedule (no
    per-example clipping or noise; ``noise-multiplier`` and ``target-epsilon`` are z's)."""
    return dataclasses.replace(settings, noise_multiplier=0.0, max_grad_norm=math.inf, target_epsilon=None)


CLIP_RANGE = 2.0**20
"""Adaptive clipping keeps S within a factor 2²⁰ (about 10⁶) of the run's ``user-clip`` S₀.
S₀ is the user's guess, and adaptive clipping is there to correct guesses that are orders of
magnitude off (docs/user-level.md: from 100× too large), never a million-fold; the bound
keeps S, the noise z·S and a distributed round's lattice (``fine_scale``) finite and
positive whatever the noisy counts say, so no booked round is sent an S it cannot run."""

POPULATION, USER_CLIP = "population", "user-clip"
"""The keys of ``UserLevel.state`` in the checkpoint."""


def resumed_state(state: Mapping[str, Any]) -> tuple[int, float]:
    """(population, S) from a checkpoint's strategy state; ``StateError`` where it holds none."""
    population, clip = state.get(POPULATION), state.get(USER_CLIP)
    if not (isinstance(population, int) and not isinstance(population, bool) and population >= 1
            and isinstance(clip, (int, float)) and not isinstance(clip, bool) and math.isfinite(clip) and clip > 0):
        raise StateError(f"the checkpoint holds no user-level state to resume (population and S), got {state!r}")
    return population, float(clip)


def check_user_reply(reply: Message, charge: Charge, global_arrays: ArrayRecord, clip: float,
                     count_only: bool = False) -> str | None:
    """Why a user-level TRAIN reply cannot be summed, or ``None`` when it can; ``count_only``:
    a count-only round's reply, the bit and the charge alone."""
    content = reply.content
    records = {protocol.PRIVACY, userlevel.USER} | (set() if count_only else {protocol.ARRAYS})
    if set(content.keys()) != records:
        return f"expected exactly the records {', '.join(map(repr, sorted(records)))}"
    try:
        reported = protocol.read_charge(content.config_records[protocol.PRIVACY])
        bit = content.metric_records[userlevel.USER][userlevel.UNDER_CLIP]
    except (KeyError, protocol.ProtocolError) as err:
        return f"unreadable reply: {err}"
    if reported != charge:
        return f"reported {reported} differs from the booked {charge}"
    if bit not in (0, 1) or isinstance(bit, (bool, list)):
        return f"{userlevel.UNDER_CLIP} must be 0 or 1, got {bit!r}"
    if count_only:
        return None
    delta = content.array_records[protocol.ARRAYS]
    if array_spec(delta) != array_spec(global_arrays):
        return "the delta does not match the global model's names, shapes and dtypes"
    values = [a.numpy().astype(np.float64) for a in delta.values()]
    if not all(np.isfinite(v).all() for v in values):
        return "non-finite values in the delta"
    norm = math.sqrt(sum(float(np.sum(v * v)) for v in values))
    if not norm <= clip * (1 + 1e-6):
        return f"delta norm {norm:.6g} exceeds the clip S = {clip:.6g}"
    return None


def calibrated_noise(settings: RunSettings, sample_rate: float, expected_cohort: float) -> float:
    """z for ``target-epsilon`` after the W count-only rounds and ``rounds`` − W rounds of
    ``user_round_event`` at q = ``sample_rate``. The count-only rounds are priced at σ_b =
    ``clip-count-noise`` or m/20, never above the σ_b the run then uses (max(m/20, z)): the
    target holds."""
    assert settings.target_epsilon is not None  # RunSettings requires it without noise-multiplier
    return calibrate_user_noise(settings.target_epsilon, settings.delta, sample_rate, settings.rounds,
                                settings.clip_warmup_rounds,
                                count_noise(settings.clip_count_noise, expected_cohort, None))


def adapted_clip(clip: float, centred: float, expected: float, quantile: float, lr: float,
                 bounds: tuple[float, float]) -> tuple[float, float]:
    """(S', b̃): Andrew et al.'s step of size η = ``lr`` from the noisy centred count
    Σ(b − ½) + N(0, σ_b²): b̃ = centred / m + ½ clamped to [0, 1], S' = S·exp(−η(b̃ − γ))
    clamped to ``bounds`` (taken in logs: no ``exp`` overflows, whatever η)."""
    estimate = min(1.0, max(0.0, centred / expected + 0.5))
    low, high = bounds
    log_clip = min(math.log(high), max(math.log(low), math.log(clip) - lr * (estimate - quantile)))
    return min(high, max(low, math.exp(log_clip))), estimate  # exp may round a hair past a bound


class UserLevel:
    """The parts of a central user-level round: the population booked, a Poisson cohort,
    plain replies checked against S, the noisy mean of the clipped deltas, S's step."""

    def __init__(self, settings: RunSettings, nodes: Mapping[int, Assignment], seed: int = 0,
                 resumed: Mapping[str, Any] | None = None) -> None:
        if settings.resume or resumed is not None:
            population, clip = resumed_state(resumed or {})
        else:
            population, clip = len(nodes), settings.user_clip
        self.known = len(nodes)  # the clients known now (late joiners too: ``book``)
        self.population_size = population  # q's denominator: the clients discovered at the run's start
        self.expected_cohort = settings.cohort or population
        if self.expected_cohort > population:
            raise SettingsError(f"cohort {self.expected_cohort} exceeds the {population} clients discovered")
        self.sample_rate = self.expected_cohort / population
        self.seed = seed
        self.noise_multiplier = settings.noise_multiplier if settings.noise_multiplier is not None else \
            self.calibrated_noise(settings)
        self.quantile = settings.clip_quantile
        self.clip_lr = settings.clip_lr
        self.count_noise = count_noise(settings.clip_count_noise, self.expected_cohort, self.noise_multiplier) \
            if self.quantile else None
        self.delta_multiplier = self.noise_multiplier if self.count_noise is None else \
            delta_noise_multiplier(self.noise_multiplier, self.count_noise)
        self.warmup_rounds, self.warmup_lr = settings.clip_warmup_rounds, settings.clip_warmup_lr
        self.clip, self.clip_bounds = clip, (settings.user_clip / CLIP_RANGE, settings.user_clip * CLIP_RANGE)
        self.randomness = settings.server_randomness
        self.event = self.round_event()
        self.collector: Collector = PlainReplies(self.check)
        self._population = 0
        self._noise = RoundNoise(self.randomness, self.seed, 0)
        if self.randomness is ServerRandomness.SEEDED:
            log(WARNING, "server-randomness = 'seeded': the cohorts and noise follow the run's seed; whoever "
                         "knows the run config can strip the noise (simulations and tests only)")

    def calibrated_noise(self, settings: RunSettings) -> float:
        """z for ``target-epsilon`` (``calibrated_noise``)."""
        return calibrated_noise(settings, self.sample_rate, self.expected_cohort)

    def round_event(self) -> DpEvent:
        """What one training round costs each client of the population (its population-ledger booking)."""
        return user_round_event(self.sample_rate, self.noise_multiplier)

    def count_only(self, server_round: int) -> bool:
        """Whether ``server_round`` is one of the W count-only rounds that place S."""
        return server_round <= self.warmup_rounds

    def booked_event(self, server_round: int) -> DpEvent:
        """What ``server_round`` costs each client of the population."""
        if self.count_only(server_round):
            assert self.count_noise is not None  # RunSettings: warm-up needs clip-quantile
            return count_round_event(self.sample_rate, self.count_noise)
        return self.event

    def node_event(self, server_round: int) -> DpEvent:
        """What a node that took part in ``server_round`` books against its records."""
        if self.count_only(server_round):
            assert self.count_noise is not None
            return count_participant_event(self.count_noise)
        return participant_event(self.noise_multiplier)

    def state(self) -> dict[str, Any]:
        """S (adaptive) and the population q is drawn from: checkpointed after every round. The
        cohorts and noise are drawn per round (``RoundNoise``), and the population of a round
        is who the ledger can afford, so nothing else carries over."""
        return {POPULATION: self.population_size, USER_CLIP: self.clip}

    def resolved(self) -> dict[str, Any]:
        """The user-level settings as they resolved (``results.json``'s ``resolved.user_level``)."""
        return {"user_level": {"sample_rate": self.sample_rate, "expected_cohort": self.expected_cohort,
                "noise_multiplier": self.noise_multiplier, "delta_noise_multiplier": self.delta_multiplier,
                "clip_count_noise": self.count_noise, "clip_quantile": self.quantile, "clip_lr": self.clip_lr,
                "final_clip": self.clip, "clip_warmup_rounds": self.warmup_rounds,
                "clip_warmup_lr": self.warmup_lr, "server_randomness": self.randomness.value,
                "node_event": "GaussianEvent(z / 2) per round taken part in"
                              + (", GaussianEvent(σ_b) per count-only round" if self.warmup_rounds else "")}}

    def assigned(self, assignment: Assignment) -> Assignment:
        return assignment

    def book(self, booking: Booking) -> list[int]:
        """Book the round for the whole population, then Poisson-sample the cohort."""
        self.known = len(booking.nodes)
        ordered = sorted(booking.nodes, key=lambda n: client_order(booking.nodes[n].client_id))
        charge = Charge(booking.entry, (self.booked_event(booking.server_round),))
        population = book_population(booking, ordered, charge)
        self._noise = RoundNoise(self.randomness, self.seed, booking.server_round)
        draws = self._noise.uniform(len(population))
        self._population = len(population)
        sampled = [n for n, u in zip(population, draws, strict=True) if u < self.sample_rate and n in booking.online]
        log(INFO, "configure_train: %d of %d clients sampled (q = %.4g), all %d booked",
            len(sampled), len(population), self.sample_rate, len(population))
        return sampled

    @property
    def expected(self) -> float:
        """The expected cohort m = q·|P| of the round."""
        return self.sample_rate * self._population

    def opened(self, rnd: Round) -> None:
        """Log S, |P| and m in the round's train metrics."""
        rnd.log.train_metrics = {"user_clip": self.clip, "population": self._population,
                                 "expected_cohort": self.expected}

    def train_config(self, rnd: Round, assignment: Assignment) -> dict[str, Any]:
        """The client's plan, S and z; a count-only round says so, with σ_b."""
        config: dict[str, Any] = {**assignment.config, **userlevel.user_round_config(self.clip, self.noise_multiplier)}
        if self.count_only(rnd.number):
            config |= {userlevel.COUNT_ONLY: True, userlevel.COUNT_NOISE: self.count_noise}
        return config

    def check(self, rnd: Round, assignment: Assignment, reply: Message) -> str | None:
        """``check_user_reply`` against the node's event and the round's S."""
        charge = Charge(rnd.entry, (self.node_event(rnd.number),))
        return check_user_reply(reply, charge, rnd.arrays, self.clip, self.count_only(rnd.number))

    def update(self, rnd: Round, collected: Collected) -> ArrayRecord | None:
        """Global model + (Σ clipped deltas + N(0, (z_Δ S)²)) / (q·|P|); S's adaptive step. A
        count-only round releases the noisy count alone: S steps, the model stays."""
        accepted = sorted(collected.replies, key=lambda item: client_order(item[0].client_id))  # arrival-independent
        bits = [_bit(content) for _, content in accepted]
        if self.count_only(rnd.number):
            rnd.log.train_metrics["count_only"] = 1
            self.adapt_clip(self.noisy_count(bits), rnd.log, self.warmup_lr)
            return None
        deltas = [{name: a.numpy() for name, a in content.array_records[protocol.ARRAYS].items()}
                  for _, content in accepted]
        out = noisy_step({name: a.numpy() for name, a in rnd.arrays.items()}, deltas, self._noise,
                         self.delta_multiplier * self.clip, self.expected)
        if self.quantile is not None:
            self.adapt_clip(self.noisy_count(bits), rnd.log, self.clip_lr)
        return ArrayRecord({name: Array(value) for name, value in out.items()})

    def noisy_count(self, bits: Iterable[float]) -> float:
        """Σ(b − ½) + N(0, σ_b²) over the accepted replies' bits (the round's last draw)."""
        assert self.count_noise is not None
        return sum(bit - 0.5 for bit in bits) + float(self._noise.normal((1,), self.count_noise)[0])

    def adapt_clip(self, centred: float, round_log: RoundLog, lr: float) -> None:
        """S's step (``adapted_clip``) from the noisy centred count, b̃ in the round's metrics."""
        assert self.quantile is not None
        self.clip, round_log.train_metrics["under_clip_estimate"] = adapted_clip(
            self.clip, centred, self.expected, self.quantile, lr, self.clip_bounds)


def _bit(content: RecordDict) -> float:
    """The bit 1[‖Δ‖ ≤ S] of a reply ``check_user_reply`` accepted."""
    bit = content.metric_records[userlevel.USER][userlevel.UNDER_CLIP]
    assert isinstance(bit, (int, float))  # check_user_reply refused any other
    return float(bit)
