"""The planner: for a federation's shape, each privacy mode's noise, ε per round, the rounds
a budget affords and the aggregate's noise-to-signal, side by side. It reads no data and
no ledger (``python -m fedpriv.planning``, also ``python -m fedpriv.privacy plan``;
``simulations.mnist --dry-run``). It sits above ``training`` and ``distributed`` (whose
setup it calls, as the server does), so accounting (``fedpriv.privacy``) stays the bottom layer.

One function per mode (``PLANNERS``), each ``(Federation) -> dict``:

- ``local``: record-level DP-SGD on each node, as ``server.assign`` plans it (the data set's
  default plan, the lot shared out at q = lot / Σ min(N, cap) unless ``lot_size`` gives every
  client its own, σ calibrated by ``calibrate_plan``); a client's trajectory assumes it trains
  every round and its N is public (a DP count would add its event).
- ``user``: user-level DP-FedAvg, q = cohort / population, one ``user_round_event(q, z)`` per
  round for every client, z calibrated by ``calibrate_user_noise`` (the server's)
  (``dpsgd_event(z, q, R)`` is exactly R such rounds). With ``count_rounds`` W (adaptive
  clipping's count-only rounds) rounds 1..W are ``count_round_event(q, σ_b)`` and z is
  calibrated for the R − W after them, as ``server.userlevel`` does (σ_b = ``count_noise``,
  else m/20 to calibrate and max(m/20, z) to book).
- ``user-distributed``: user level with the clients' noise shares under SecAgg+
  (``server.userlevel_distributed``): the same q, ``distributed_user_round_event`` for the
  nominal ⌊m⌋ shares carrying z·c on the lattice of ``user_clip`` S for ``model``, z
  calibrated on it by ``calibrate_distributed_noise``.
- ``distributed``: one DP-SGD step per round on the union, set up by the server's own
  ``fedpriv.distributed.setup.distributed_setup`` with what the server gives it: the plan of
  ``model`` and ``max_grad_norm``, q = lot / Σ min(N, cap) (``training.plan.size_cap``), the
  nominal cohort K = every client, ``rounds`` steps, σ as given (a fixed σ is kept, never
  re-calibrated) or calibrated for the target, and without ``lot_size`` the large lot the run
  takes then (``large_lot``: ΣN / 3, three steps an epoch).

Each mode counts its own rounds: ``rounds`` (planned: a run's ``--rounds``, which distributed
mode reads as DP-SGD steps), ``epsilon`` (ε after each), ``rounds_affordable`` (count-only
rounds included); ``steps_per_round`` (DP-SGD steps, None for user level) and
``steps_affordable`` (= rounds affordable × steps per round) put the record-level modes on
one scale.

Noise-to-signal is the std of the noise in the aggregated update, per coordinate, in units
of one contribution's bound (C per example for the record-level modes, per DP-SGD step; S
per client for user level, per round), for a cohort of clients of the mean size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedpriv.privacy.accountants import AccountantKind, epsilon_of
from fedpriv.privacy.calibration import calibrate_distributed_noise
from fedpriv.privacy.events import ComposedEvent, DpEvent, SelfComposedEvent
from fedpriv.privacy.userlevel import (
    calibrate_user_noise,
    count_noise,
    count_round_event,
    distributed_count_round_event,
    distributed_user_round_event,
    user_round_event,
)
from fedpriv.training import TrainingPlan, calibrate_plan, default_plan
from fedpriv.training.plan import shared_plan, size_cap

MAX_ROUNDS = 1_000_000
"""The most rounds ``rounds_affordable`` looks for."""


@dataclass(frozen=True)
class Federation:
    """What the planner is told: the federation's shape and the guarantee sought."""

    population: int
    rounds: int
    delta: float
    cohort: int | None = None
    sizes: tuple[int, ...] = ()
    lot_size: int | None = None
    local_epochs: int = 1
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    dataset: str = "mnist"
    accountant: AccountantKind = AccountantKind.RDP
    count_rounds: int = 0
    count_noise: float | None = None
    model: str | None = None
    max_grad_norm: float | None = None
    user_clip: float = 1.0
    lattice_rounding: str = "nearest"
    model_dimension: int | None = None
    """The planned model's parameter count where ``fedpriv.models`` cannot build it (a user's task)."""

    def __post_init__(self) -> None:
        if self.population < 1 or self.rounds < 1 or self.local_epochs < 1:
            raise ValueError("population, rounds and local epochs must be >= 1")
        if not 1 <= self.expected_cohort <= self.population:
            raise ValueError(f"cohort must be in [1, population = {self.population}], got {self.cohort}")
        if self.target_epsilon is None and self.noise_multiplier is None:
            raise ValueError("give a target epsilon (to calibrate the noise) or a noise multiplier, or both")
        if any(n < 1 for n in self.sizes):
            raise ValueError("every client holds >= 1 record")
        if not 0 <= self.count_rounds < self.rounds:
            raise ValueError(f"count-only rounds must be in [0, rounds = {self.rounds}), got {self.count_rounds}")
        if self.count_noise is not None and not (math.isfinite(self.count_noise) and self.count_noise > 0):
            raise ValueError(f"clip-count-noise must be finite and > 0, got {self.count_noise}")

    def count_noise_for(self, noise_multiplier: float | None) -> float:
        """σ_b of the count-only rounds, as the server sets it (``userlevel.count_noise``)."""
        return count_noise(self.count_noise, self.expected_cohort, noise_multiplier)

    @property
    def expected_cohort(self) -> int:
        """Clients per round (all when unset)."""
        return self.population if self.cohort is None else self.cohort

    def training_plan(self, **overrides: Any) -> TrainingPlan:
        """The data set's default plan with this federation's overrides (``server.assign.base_plan``'s)."""
        return default_plan(self.dataset, model=self.model, max_grad_norm=self.max_grad_norm, lot_size=self.lot_size,
                            local_epochs=self.local_epochs, noise_multiplier=self.noise_multiplier, **overrides)

    @property
    def dimension(self) -> int:
        """The number of parameters of the planned model (torch: the distributed modes' lattice)."""
        if self.model_dimension is not None:
            return self.model_dimension
        from fedpriv.models import build_model

        return sum(t.numel() for t in build_model(self.training_plan().model, 0).state_dict().values())


Warmup = tuple[DpEvent, int]
"""(a count-only round's event, how many run first)."""


def after(round_event: DpEvent, rounds: int, warmup: Warmup | None = None) -> DpEvent:
    """What rounds 1..``rounds`` cost: the first W of ``warmup``'s event, the rest ``round_event``."""
    count_event, count_rounds = warmup or (round_event, 0)
    if rounds <= count_rounds:
        return SelfComposedEvent(count_event, rounds)
    trained = SelfComposedEvent(round_event, rounds - count_rounds)
    return ComposedEvent((SelfComposedEvent(count_event, count_rounds), trained)) if count_rounds else trained


def trajectory(round_event: DpEvent, rounds: int, delta: float, accountant: AccountantKind,
               warmup: Warmup | None = None) -> list[float]:
    """ε after each of rounds 1..R (RDP: one curve per event, R conversions)."""
    return [epsilon_of(after(round_event, r, warmup), delta, accountant) for r in range(1, rounds + 1)]


def rounds_affordable(round_event: DpEvent, target: float, delta: float, accountant: AccountantKind,
                      warmup: Warmup | None = None) -> int:
    """The most rounds (``warmup``'s first) whose ε stays ≤ ``target`` (up to ``MAX_ROUNDS``)."""
    def fits(r: int) -> bool:
        return epsilon_of(after(round_event, r, warmup), delta, accountant) <= target

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_ROUNDS and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > MAX_ROUNDS:
        return MAX_ROUNDS
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _mode(fed: Federation, mode: str, round_event: DpEvent, noise_multiplier: float, sample_rate: float,
          noise_to_signal: float, steps_per_round: int | None, warmup: Warmup | None = None,
          **extra: Any) -> dict[str, Any]:
    """A mode's column: ``fed.rounds`` of its rounds of ``round_event`` (module docstring),
    the first of ``warmup``'s."""
    target = fed.target_epsilon
    affordable = None if target is None else \
        rounds_affordable(round_event, target, fed.delta, fed.accountant, warmup)
    return {"mode": mode, "available": True, "noise_multiplier": noise_multiplier, "sample_rate": sample_rate,
            **extra, "rounds": fed.rounds, "steps_per_round": steps_per_round,
            "count_only_rounds": warmup[1] if warmup else 0,
            "epsilon": trajectory(round_event, fed.rounds, fed.delta, fed.accountant, warmup),
            "rounds_affordable": affordable,
            "steps_affordable": None if affordable is None or steps_per_round is None else affordable * steps_per_round,
            "noise_to_signal": noise_to_signal}


def plan_user(fed: Federation) -> dict[str, Any]:
    """User-level DP-FedAvg: q = cohort / population, z for ``rounds`` rounds (or the given one)."""
    q, count_rounds = fed.expected_cohort / fed.population, fed.count_rounds
    z = fed.noise_multiplier
    if z is None:
        assert fed.target_epsilon is not None  # Federation checked it
        z = calibrate_user_noise(fed.target_epsilon, fed.delta, q, fed.rounds, count_rounds,
                                 fed.count_noise_for(None), fed.accountant)
    warmup = (count_round_event(q, fed.count_noise_for(z)), count_rounds) if count_rounds else None
    return _mode(fed, "user", user_round_event(q, z), z, q, z / fed.expected_cohort, None, warmup,
                 expected_cohort=fed.expected_cohort, unit="S per client, per round")


def plan_user_distributed(fed: Federation) -> dict[str, Any]:
    """User-level DP-FedAvg whose noise the cohort adds: the population ledger's event for z
    (given, or calibrated for ``rounds`` rounds)."""
    from fedpriv.distributed.lattice import Rounding
    from fedpriv.distributed.setup import user_level_lattice

    q, shares, dimension = fed.expected_cohort / fed.population, max(1, fed.expected_cohort), fed.dimension
    lattice = user_level_lattice(fed.user_clip, dimension, Rounding(fed.lattice_rounding), fed.population,
                                 fed.noise_multiplier or 0.0)
    z = fed.noise_multiplier
    if z is None:
        assert fed.target_epsilon is not None  # Federation checked it
        prior = (distributed_count_round_event(q, fed.count_noise_for(None), shares),) * fed.count_rounds
        share = calibrate_distributed_noise(fed.target_epsilon, fed.delta, q, fed.rounds - fed.count_rounds, shares,
                                            lattice.sensitivity, dimension, accountant=fed.accountant,
                                            prior_events=prior)
        z = share * math.sqrt(shares) / lattice.clip
    event = distributed_user_round_event(q, lattice.noise_stddev(z, shares), shares, lattice.sensitivity, dimension)
    warmup = (distributed_count_round_event(q, fed.count_noise_for(z), shares), fed.count_rounds) \
        if fed.count_rounds else None
    return _mode(fed, "user-distributed", event, z, q, z / fed.expected_cohort, None, warmup,
                 expected_cohort=fed.expected_cohort, shares=shares,
                 sensitivity_inflation=lattice.sensitivity / lattice.clip, unit="S per client, per round")


def plan_local(fed: Federation) -> dict[str, Any]:
    """Record-level DP-SGD on each node, planned as ``server.assign`` plans it; the client
    of the fewest records (the largest q with a per-client lot) is the one reported."""
    if not fed.sizes:
        return {"mode": "local", "available": False, "reason": "needs --records-per-client or --data-sizes"}
    plan = fed.training_plan(lr_decay_rounds=fed.rounds)
    if fed.lot_size is None:
        plan = shared_plan(plan, fed.sizes)
    n = min(fed.sizes)
    if fed.noise_multiplier is None:
        assert fed.target_epsilon is not None  # Federation checked it
        plan = calibrate_plan(plan, fed.target_epsilon, fed.delta, n, rounds=fed.rounds)
    (round_event,) = plan.round_events(n)
    q = plan.sample_rate(n)
    mean = sum(fed.sizes) / len(fed.sizes)
    lot = plan.sample_rate(round(mean)) * mean  # a mean-sized client's expected lot
    return _mode(fed, "local", round_event, plan.noise_multiplier, q,
                 plan.noise_multiplier / (lot * math.sqrt(fed.expected_cohort)), plan.steps_per_round(n),
                 num_examples=n, lot_size=plan.lot_size, unit="C per example, per DP-SGD step")


def plan_distributed(fed: Federation) -> dict[str, Any]:
    """Distributed DP (SecAgg and integer noise shares), set up by ``distributed_setup`` as
    ``server.distributed`` sets it up; its rounds are DP-SGD steps, one each."""
    if not fed.sizes:
        return {"mode": "distributed", "available": False, "reason": "needs --records-per-client or --data-sizes"}
    from fedpriv.distributed.lattice import Rounding
    from fedpriv.distributed.setup import distributed_setup

    cap = size_cap(fed.sizes)
    total = sum(min(n, cap) for n in fed.sizes)
    target = fed.target_epsilon if fed.noise_multiplier is None else None  # a given σ is the run's
    setup = distributed_setup(fed.training_plan(), total, fed.population, fed.rounds, target, fed.delta,
                              Rounding(fed.lattice_rounding), released=fed.sizes, choose_lot=fed.lot_size is None,
                              dimension=fed.model_dimension)
    (round_event,) = setup.events
    sigma = setup.plan.noise_multiplier
    return _mode(fed, "distributed", round_event, sigma, setup.sample_rate, sigma / (setup.sample_rate * total), 1,
                 shares=fed.population, lot_size=setup.plan.lot_size,
                 sensitivity_inflation=setup.lattice.sensitivity / setup.lattice.clip,
                 modulus_bits=setup.lattice.modulus_bits, unit="C per example, per DP-SGD step (one step per round)")


PLANNERS: dict[str, Callable[[Federation], dict[str, Any]]] = {
    "local": plan_local, "distributed": plan_distributed, "user": plan_user, "user-distributed": plan_user_distributed,
}


def plan(fed: Federation, modes: Sequence[str] = tuple(PLANNERS)) -> dict[str, Any]:
    """Each of ``modes`` planned for ``fed``: {"federation": ..., "modes": {mode: plan}}."""
    return {
        "federation": {"population": fed.population, "cohort": fed.expected_cohort, "rounds": fed.rounds,
                       "delta": fed.delta, "target_epsilon": fed.target_epsilon,
                       "noise_multiplier": fed.noise_multiplier, "lot_size": fed.lot_size,
                       "local_epochs": fed.local_epochs, "clients_with_sizes": len(fed.sizes),
                       "accountant": fed.accountant.value, "count_only_rounds": fed.count_rounds,
                       "clip_count_noise": fed.count_noise, "model": fed.training_plan().model,
                       "max_grad_norm": fed.training_plan().max_grad_norm, "user_clip": fed.user_clip,
                       "lattice_rounding": fed.lattice_rounding},
        "modes": {mode: PLANNERS[mode](fed) for mode in modes},
    }


def table(result: dict[str, Any]) -> str:
    """The plan as text: one column per mode, each counting its own rounds (distributed: one
    DP-SGD step each); the ε rows are after round r of ``--rounds``."""
    modes = list(result["modes"].values())
    rounds = result["federation"]["rounds"]

    def cell(m: dict[str, Any], key: str) -> str:
        if not m["available"]:
            return m["reason"] if key == "noise_multiplier" else "-"
        value = m[key]
        return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    rows = [["", *(m["mode"] for m in modes)],
            ["noise multiplier", *(cell(m, "noise_multiplier") for m in modes)],
            ["sample rate q", *(cell(m, "sample_rate") for m in modes)],
            ["DP-SGD steps per round", *(cell(m, "steps_per_round") for m in modes)],
            ["rounds planned", *(cell(m, "rounds") for m in modes)],
            *([["of them count-only", *(cell(m, "count_only_rounds") for m in modes)]]
              if result["federation"].get("count_only_rounds") else []),
            ["rounds affordable", *(cell(m, "rounds_affordable") for m in modes)],
            ["DP-SGD steps affordable", *(cell(m, "steps_affordable") for m in modes)],
            ["noise-to-signal", *(cell(m, "noise_to_signal") for m in modes)]]
    marks = sorted({1, rounds, *range(max(1, rounds // 4), rounds + 1, max(1, rounds // 4))})
    rows += [[f"epsilon after round {r}", *(f"{m['epsilon'][r - 1]:.4g}" if m["available"] else "-" for m in modes)]
             for r in marks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def plot(result: dict[str, Any], path: str) -> None:
    """ε per round of each available mode, to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in result["modes"].values():
        if m["available"]:
            ax.plot(range(1, len(m["epsilon"]) + 1), m["epsilon"], label=m["mode"])
    target = result["federation"]["target_epsilon"]
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label="target")
    ax.set_xlabel("round")
    ax.set_ylabel(f"epsilon (delta = {result['federation']['delta']:g})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
