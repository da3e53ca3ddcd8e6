"""The planner: for a federation's shape, each privacy mode's noise, ε per round, the rounds
a budget affords and the aggregate's noise-to-signal, side by side. It reads no data and
no ledger (``python -m fedpriv.privacy plan``; ``simulations.mnist --dry-run``).

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
  nominal ⌊m⌋ shares carrying z·c on the lattice of S = 1 for the data set's default model
  (Δ₂/c ≤ 1.001 whatever S), z calibrated on it by ``calibrate_distributed_noise``.
- ``distributed``: one DP-SGD step per round on the union (``fedpriv.distributed.setup``, what
  the server runs: q = lot / ΣN, the lattice, σ for the nominal cohort of ``cohort`` shares
  under Zhu & Wang's subsampling bound), over as many steps as local mode takes in
  ``rounds`` rounds, so the two columns compare the same training: its rounds are steps
  (``rounds`` = local mode's steps per round × ``Federation.rounds``).

Each mode counts its own rounds: ``rounds`` (planned), ``epsilon`` (ε after each),
``rounds_affordable`` (count-only rounds included); ``steps_per_round`` (DP-SGD steps, None for user level) and
``steps_affordable`` (= rounds affordable × steps per round) put the record-level modes
on one scale, and the table's ε rows compare them at the same training (``table``).

Noise-to-signal is the std of the noise in the aggregated update, per coordinate, in units
of one contribution's bound (C per example for the record-level modes, per DP-SGD step; S
per client for user level, per round), for a cohort of clients of the mean size.
"""

from __future__ import annotations

import dataclasses
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
    dimension: int | None = None
    """The model's parameter count (None: the data set's model's; a user's task gives its own)."""

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
    from fedpriv.models import build_model
    from fedpriv.training import default_plan

    q, shares = fed.expected_cohort / fed.population, fed.expected_cohort
    dimension = fed.dimension or \
        sum(t.numel() for t in build_model(default_plan(fed.dataset).model, 0).state_dict().values())
    lattice = user_level_lattice(1.0, dimension, Rounding.NEAREST, fed.population, fed.noise_multiplier or 0.0)
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
    from fedpriv.training import calibrate_plan, default_plan
    from fedpriv.training.plan import shared_plan

    plan = default_plan(fed.dataset, lot_size=fed.lot_size, local_epochs=fed.local_epochs,
                        noise_multiplier=fed.noise_multiplier, lr_decay_rounds=fed.rounds)
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
    """Distributed DP (SecAgg and integer noise shares), set up as ``server.distributed`` sets
    it up, for local mode's number of DP-SGD steps; its rounds are those steps, one each."""
    if not fed.sizes:
        return {"mode": "distributed", "available": False, "reason": "needs --records-per-client or --data-sizes"}
    from fedpriv.distributed.setup import distributed_setup
    from fedpriv.dpsgd.config import steps_per_epoch
    from fedpriv.training import default_plan

    plan = default_plan(fed.dataset, lot_size=fed.lot_size, noise_multiplier=fed.noise_multiplier)
    total = sum(fed.sizes)
    steps = fed.rounds * fed.local_epochs * steps_per_epoch(min(1.0, plan.lot_size / total))
    setup = distributed_setup(plan, total, fed.expected_cohort, steps, fed.target_epsilon, fed.delta,
                              dimension=fed.dimension)
    (round_event,) = setup.events
    sigma = setup.plan.noise_multiplier
    steps_fed = dataclasses.replace(fed, rounds=steps)
    return _mode(steps_fed, "distributed", round_event, sigma, setup.sample_rate,
                 sigma / (setup.sample_rate * total), 1, shares=fed.expected_cohort,
                 sensitivity_inflation=setup.lattice.sensitivity / setup.lattice.clip,
                 unit="C per example, per DP-SGD step (one step per round)")


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
                       "clip_count_noise": fed.count_noise},
        "modes": {mode: PLANNERS[mode](fed) for mode in modes},
    }


def _per_round(m: dict[str, Any], rounds: int) -> int:
    """A mode's own rounds per round of the federation's ``rounds`` (distributed: its steps)."""
    return len(m["epsilon"]) // rounds


def table(result: dict[str, Any]) -> str:
    """The plan as text: one column per mode, each counting its own rounds; the ε rows are
    after round r of ``--rounds``, which is round r·k of a mode doing k rounds per round
    (distributed, one DP-SGD step each: named in the row)."""
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
    scaled = [(m["mode"], k) for m in modes if m["available"] and (k := _per_round(m, rounds)) != 1]
    rows += [[f"epsilon after round {r}" + "".join(f" ({name}: {r * k})" for name, k in scaled),
              *(f"{m['epsilon'][r * _per_round(m, rounds) - 1]:.4g}" if m["available"] else "-" for m in modes)]
             for r in marks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def plot(result: dict[str, Any], path: str) -> None:
    """ε per round of each available mode, to ``path`` (PNG); a mode doing k of its rounds per
    round of ``--rounds`` (distributed) is drawn at its round / k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = result["federation"]["rounds"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in result["modes"].values():
        if m["available"]:
            k = _per_round(m, rounds)
            label = m["mode"] if k == 1 else f"{m['mode']} ({k} rounds of one DP-SGD step per round)"
            ax.plot([i / k for i in range(1, len(m["epsilon"]) + 1)], m["epsilon"], label=label)
    target = result["federation"]["target_epsilon"]
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label="target")
    ax.set_xlabel("round")
    ax.set_ylabel(f"epsilon (delta = {result['federation']['delta']:g})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
