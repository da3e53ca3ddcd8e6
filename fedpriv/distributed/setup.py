"""A distributed run's setup, shared by the server (``server.distributed``) and the planner
(``fedpriv.planning``): the shared rate q, the lattice, σ for the nominal cohort, the
modulus, and what one round books and sends.

The server's ledger books the *nominal* event: a cohort of K shares that together carry σ·C
(``DistributedSetup.events``). Each node books, in its own ledger, the event its own policy
guarantees (``clients.distributed``); that one is the guarantee.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedpriv.distributed.lattice import NOISE_TAIL, Lattice, Rounding, check_headroom, fine_scale
from fedpriv.dpsgd.config import steps_per_epoch
from fedpriv.models import build_model
from fedpriv.privacy import distributed_dpsgd_event
from fedpriv.privacy.calibration import calibrate_distributed_noise
from fedpriv.privacy.events import DpEvent
from fedpriv.privacy.userlevel import COUNT_ONLY_SCALE, count_scale
from fedpriv.training import TrainingPlan


@dataclass(frozen=True)
class DistributedSetup:
    """What every round of a distributed run uses: the plan (σ calibrated for the nominal
    cohort), the shared q, the lattice, the nominal cohort K and SecAgg+'s neighbours per
    node (0: the full graph)."""

    plan: TrainingPlan
    sample_rate: float
    lattice: Lattice
    cohort: int
    secagg_neighbours: int = 0
    count_noise: float = 0.0
    """The largest std of the nodes' released counts of N (0: all public): ``lot_bound``'s margin."""

    @property
    def events(self) -> tuple[DpEvent, ...]:
        """The nominal event of one round: K shares that together carry σ·C."""
        return (nominal_event(self.plan.noise_multiplier, self.sample_rate, self.lattice, self.cohort, 1),)

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.sample_rate)

    def resolved(self) -> dict[str, object]:
        """What ``results.json`` adds for a distributed run."""
        return {
            "privacy": "distributed", "noise_multiplier": self.plan.noise_multiplier, "lot_size": self.plan.lot_size,
            "shared_sample_rate": self.sample_rate, "nominal_cohort": self.cohort,
            "lattice_scale": self.lattice.scale, "dimension": self.lattice.dimension,
            "sensitivity": self.lattice.sensitivity,
            "sensitivity_inflation": self.lattice.sensitivity / (self.plan.max_grad_norm * self.lattice.scale),
            "modulus_bits": self.lattice.modulus_bits, "lattice_rounding": str(self.lattice.rounding),
            "secagg_neighbours": self.secagg_neighbours,
        }

    def round_lattice(self, released: Sequence[float]) -> Lattice:
        """The lattice of a round whose cohort released the counts ``released``: the run's scale,
        with the smallest modulus that the cohort's sum cannot wrap (``sum_lattice``)."""
        return sum_lattice(self.lattice, [lot_bound(n, self.count_noise) for n in released],
                           self.plan.noise_multiplier)

    def config(self, lattice: Lattice | None = None) -> dict[str, str | int | float]:
        """The round's config: the plan, q and the lattice (each node checks them; default: the run's)."""
        from fedpriv.federation import protocol  # Flower's: not for the planner, which never sends a round

        lattice = lattice or self.lattice
        return {**protocol.plan_config(self.plan), protocol.SAMPLE_RATE: self.sample_rate,
                protocol.LATTICE_SCALE: lattice.scale, protocol.MODULUS_BITS: lattice.modulus_bits,
                protocol.LATTICE_ROUNDING: str(lattice.rounding)}


def nominal_event(noise_multiplier: float, sample_rate: float, lattice: Lattice, shares: int, steps: int) -> DpEvent:
    """``steps`` rounds whose ``shares`` noise shares sum to std σ·C·scale."""
    return distributed_dpsgd_event(lattice.noise_stddev(noise_multiplier, shares), shares, lattice.sensitivity,
                                   lattice.dimension, sample_rate, steps)


STEPS_PER_EPOCH = 3
"""Distributed mode's lot when the run names none (``large_lot``): ΣN / 3, three DP-SGD steps
(rounds) an epoch."""


def large_lot(total_examples: float) -> int:
    """Distributed mode's default lot, ⌈ΣN / ``STEPS_PER_EPOCH``⌉: De et al. 2022's large lots.
    Each distributed round pays secure aggregation's exchanges whatever its lot (about 10 s
    at 100 nodes here), while the gradients of E epochs cost the same at any lot, so fewer,
    larger lots at the same ε and epochs cut that overhead by the ratio of the lots (full
    MNIST: 120 rounds, not 600), and the noise on the averaged gradient, σ·C/lot, falls (σ
    grows only about as √lot)."""
    return max(1, math.ceil(total_examples / STEPS_PER_EPOCH))


def distributed_setup(plan: TrainingPlan, total_examples: float, cohort: int, rounds: int,
                      target_epsilon: float | None, delta: float,
                      rounding: Rounding = Rounding.NEAREST, prior_events: Sequence[DpEvent] = (),
                      released: Sequence[float] = (), count_noise: float = 0.0,
                      choose_lot: bool = False, dimension: int | None = None) -> DistributedSetup:
    """A distributed run's setup: with ``choose_lot`` (the run names no lot) the plan's lot is
    ``large_lot(total_examples)``; q = lot / ΣN (the released N's, capped: ``total_examples``),
    the coarsest lattice within ``fine_scale``'s inflation for the model, σ calibrated so that
    ``rounds`` steps of the nominal cohort of ``cohort`` shares end at ``target_epsilon``
    (unless σ is the plan's) beside ``prior_events`` (a node's earlier releases), and the
    smallest modulus the sum of the ``cohort`` nodes cannot wrap in (``sum_lattice``; the
    nodes' ``released`` counts, uncapped, with margin ``count_noise``: default, ``cohort``
    nodes of ``total_examples`` / ``cohort`` records each). ``dimension``: the model's
    parameter count (by default the plan's ``fedpriv.models`` model's; a user's task passes
    its own)."""
    if cohort < 1 or total_examples < 1:
        raise ValueError(f"a distributed run needs a cohort >= 1 and records, got {cohort} and {total_examples}")
    if choose_lot:
        plan = dataclasses.replace(plan, lot_size=large_lot(total_examples))
    q = min(1.0, plan.lot_size / total_examples)
    dimension = dimension or sum(p.numel() for p in build_model(plan.model, 0).parameters())
    rounding = Rounding(rounding)
    lattice = Lattice(fine_scale(plan.max_grad_norm, dimension, rounding=rounding), plan.max_grad_norm, dimension,
                      rounding=rounding)
    # the LR schedule runs over epochs of steps_per_epoch(q) rounds, as the centralized run's
    plan = dataclasses.replace(plan, lr_decay_rounds=math.ceil(rounds / steps_per_epoch(q)))
    if target_epsilon is not None:  # the share whose K copies reach the target, as a σ
        share = calibrate_distributed_noise(target_epsilon, delta, q, rounds, cohort, lattice.sensitivity, dimension,
                                            prior_events=prior_events)
        plan = dataclasses.replace(plan, noise_multiplier=share * math.sqrt(cohort) / lattice.clip)
    released = released or [total_examples / cohort] * cohort
    lattice = sum_lattice(lattice, [lot_bound(n, count_noise) for n in released], plan.noise_multiplier)
    return DistributedSetup(plan, q, lattice, cohort, count_noise=count_noise)


def lot_bound(released: float, count_noise: float = 0.0) -> int:
    """The largest lot a node can draw whose count of N was released as ``released`` with
    Gaussian noise of std ``count_noise`` (0: N public): its N, at most ñ + ``NOISE_TAIL``·σ_N
    except with probability Φ(−12) < 2⁻¹⁰⁸ (a lot never holds more than the node's records)."""
    return math.ceil(released + NOISE_TAIL * count_noise)


def sum_lattice(lattice: Lattice, max_lots: Sequence[int], noise_multiplier: float) -> Lattice:
    """``lattice`` with the smallest modulus in which the secure sum of ``len(max_lots)`` nodes,
    node i drawing at most ``max_lots[i]`` examples, cannot wrap. The noise is sized for what
    the nodes may add, not for the nominal σ·c: a node books and adds the share of its own
    policy's n ≥ 1 honest shares, std σ·c/√n ≤ σ·c, so the sum's noise has std at most
    σ·c·√K for K nodes (K default-policy nodes, n = 2, add √(K/2) times the nominal σ·c).
    docs/distributed.md, "The secure sum cannot wrap", gives the probability that it does."""
    return with_headroom(lattice, sum(max_lots), noise_multiplier * lattice.clip * math.sqrt(len(max_lots)))


def user_level_lattice(clip: float, dimension: int, rounding: Rounding, max_clients: int,
                       noise_multiplier: float, count_noise: float | None = None) -> Lattice:
    """The lattice of distributed user-level rounds (``server.userlevel_distributed``): model
    deltas (``dimension`` d) clipped to S = ``clip`` encoded as one clipped example is here
    (``fine_scale``'s scale for S and d, ``rounding``), and the smallest modulus in which the
    sum of ``max_clients`` vectors cannot wrap, even if each carried a whole z·c share of
    noise (``noise_multiplier`` z, or z_Δ). With ``count_noise`` (adaptive clipping) one more
    coordinate holds the bit, (2b − 1)·k (``count_scale``), so the lattice has d + 1."""
    dimensions = dimension + (count_noise is not None)
    lattice = Lattice(fine_scale(clip, dimensions, rounding=rounding), clip, dimensions, rounding=rounding)
    bound = lattice.sensitivity if count_noise is None or noise_multiplier == 0 else \
        math.hypot(lattice.sensitivity, count_scale(noise_multiplier * lattice.clip, count_noise))
    return with_headroom(lattice, math.ceil(max_clients * bound / lattice.sensitivity),
                         noise_multiplier * lattice.clip * math.sqrt(max_clients))


def count_only_lattice(max_clients: int, count_noise: float) -> Lattice:
    """The one-coordinate lattice of a distributed count-only round (``clip-warmup-rounds``):
    each node's (2b − 1)·k, k = ``COUNT_ONLY_SCALE``, is already an integer (scale 1); the
    smallest modulus in which ``max_clients`` of them cannot wrap, even if each carried all
    2σ_b·k of the noise."""
    lattice = Lattice(1.0, float(COUNT_ONLY_SCALE), 1, rounding=Rounding.NEAREST)
    return with_headroom(lattice, max_clients, 2 * count_noise * COUNT_ONLY_SCALE * math.sqrt(max_clients))


MODULUS_BITS = (32, 40, 48, 56, 62)
"""Secure aggregation's moduli, smallest first: each word is 4 bytes up to 32 bits, else 8."""


def with_headroom(lattice: Lattice, max_lot: int, total_noise_stddev: float) -> Lattice:
    """``lattice`` with the smallest modulus in which a sum of ``max_lot`` examples and the
    noise cannot wrap (``check_headroom``; its ValueError when none is large enough)."""
    for bits in MODULUS_BITS:
        candidate = dataclasses.replace(lattice, modulus_bits=bits)
        try:
            check_headroom(candidate, max_lot, total_noise_stddev)
        except ValueError:
            if bits == MODULUS_BITS[-1]:
                raise
            continue
        return candidate
    raise AssertionError("unreachable")
