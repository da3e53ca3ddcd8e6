"""Before a federated simulation trains: settings that are valid but will learn little say so
(``simulations.mnist`` / ``simulations.cifar``, on stderr, after the input checks and before
Ray starts), from the noise the run will add, as the server will set it up.

- Distributed mode takes one DP-SGD step per round (a lot drawn from all nodes' data), where
  a round of local mode is a whole epoch of steps on each node: ``--rounds`` means far less
  training there, so the run says how many steps it will take.
- A central user-level run books ``participant_event(z)`` (Gaussian(z/2)) in each node's
  ledger for every round it takes part in: where one such round exceeds the nodes' budget
  (by default ``--target-epsilon``, the clients' user-level ε, a different guarantee) every
  node refuses every round and nothing trains, so the run is refused (``ValueError``).
- Noise-to-signal (``fedpriv.privacy.planner``'s measure: the noise's std per coordinate of
  the aggregated update, in units of one contribution's bound) at or above
  ``POINTLESS_NOISE_TO_SIGNAL`` buries any update: such a run ends near chance accuracy
  (``--target-epsilon 0.00001``), and the run says so before spending the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedpriv.federation.settings import PrivacyMode, RunSettings, UserNoise

POINTLESS_NOISE_TO_SIGNAL = 1.0
"""At this noise per coordinate (in units of a contribution's bound, whose whole norm is at
most 1) the noise's norm is √d times the largest possible signal's."""


def _task_dimension(settings: RunSettings) -> int | None:
    """The parameter count of the run's task's model (None without a task)."""
    if settings.task is None:
        return None
    from fedpriv.task import load_task

    return sum(p.numel() for p in load_task(settings.task).build_model(settings.seed).parameters())


def federation(settings: RunSettings, num_clients: int, sizes: Sequence[int]) -> Any:
    """The planner's ``Federation`` of this run (N public; without ``--target-epsilon`` and
    ``--noise-multiplier``, the data set's default σ)."""
    from fedpriv.planning import Federation
    from server.assign import base_plan

    user = settings.privacy is PrivacyMode.USER
    base = base_plan(settings)
    noise = settings.noise_multiplier
    if noise is None and settings.target_epsilon is None:
        noise = base.noise_multiplier
    return Federation(
        population=num_clients, rounds=settings.rounds, delta=settings.delta,
        cohort=(settings.cohort or num_clients) if user else max(1, int(num_clients * settings.fraction_train)),
        sizes=tuple(sizes), lot_size=settings.lot_size,
        local_epochs=settings.local_epochs, target_epsilon=settings.target_epsilon, noise_multiplier=noise,
        dataset=base.model if settings.task else settings.dataset,
        count_rounds=settings.clip_warmup_rounds, count_noise=settings.clip_count_noise,
        model=settings.model, max_grad_norm=settings.max_grad_norm, user_clip=settings.user_clip,
        lattice_rounding=str(settings.lattice_rounding), model_dimension=_task_dimension(settings),
    )


def before_training(settings: RunSettings, num_clients: int, sizes: Sequence[int],
                    node_budget: float | None = None) -> list[str]:
    """What a user should read before this run trains (``note: ...`` / ``warning: ...``
    lines, without the program's name); none for a run of useful settings. ``ValueError``
    for one no simulated node (of ε budget ``node_budget``, None: unlimited) would train."""
    from fedpriv.planning import plan

    user_distributed = settings.privacy is PrivacyMode.USER and settings.user_noise is UserNoise.DISTRIBUTED
    mode = "user-distributed" if user_distributed else settings.privacy.value
    distributed = settings.privacy is PrivacyMode.DISTRIBUTED
    planned = plan(federation(settings, num_clients, sizes), (mode, "local") if distributed else (mode,))["modes"]
    run = planned[mode]  # the planner sets each mode up as the server will
    sigma, ratio = run["noise_multiplier"], run["noise_to_signal"]
    lines = []
    if distributed:
        local_steps = planned["local"]["steps_per_round"]
        lines.append(f"note: distributed mode takes one DP-SGD step per round, on one lot of about "
                     f"{run['lot_size']} records drawn from all nodes' data: --rounds {settings.rounds} trains "
                     f"{settings.rounds} step{'s' if settings.rounds > 1 else ''} (a round of local mode here is "
                     f"{local_steps} step{'s' if local_steps > 1 else ''} on each node)")
    if mode == "user" and node_budget is not None:
        check_node_budget(sigma, settings.delta, node_budget)
    if ratio >= POINTLESS_NOISE_TO_SIGNAL:
        remedy = "lower --noise-multiplier or take larger lots (--lot-size)" if settings.noise_multiplier is not None \
            else "raise --target-epsilon, or take fewer --rounds or larger lots (--lot-size)"
        lines.append(f"warning: the noise will bury every update (noise multiplier {sigma:.4g}, noise-to-signal "
                     f"{ratio:.3g} ≥ {POINTLESS_NOISE_TO_SIGNAL:g}: the noise's std per coordinate is at least a whole "
                     f"contribution's bound): expect chance accuracy; {remedy}")
    return lines


def check_node_budget(noise_multiplier: float, delta: float, node_budget: float) -> None:
    """``ValueError`` where one central user-level round costs a node's records more than its budget."""
    from fedpriv.privacy import epsilon_of
    from fedpriv.privacy.userlevel import participant_event

    cost = epsilon_of(participant_event(noise_multiplier), delta)
    if cost > node_budget:
        raise ValueError(
            f"argument --client-epsilon-budget: every simulated node would refuse every round: one round it takes part "
            f"in costs its records ε = {cost:.4g} (Gaussian(z/2), z = {noise_multiplier:.4g}), above its budget "
            f"{node_budget:g} (by default --target-epsilon, the clients' user-level ε); set --client-epsilon-budget, "
            "a node's record-level budget over all its rounds")
