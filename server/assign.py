"""Each client's plan: the data set's default, the run's overrides, and its own σ.

In target-ε mode σ is calibrated per client from its own N (q = lot / N differs between
clients), so that ``rounds`` rounds of its event end at ≤ ``target-epsilon``: R rounds of
``dpsgd_event(σ, q, s)`` compose exactly like one ``dpsgd_event(σ, q, R·s)``.
"""

from __future__ import annotations

from collections.abc import Mapping

from clients import protocol
from clients.config import RunSettings
from fedpriv.training import TrainingPlan, calibrate_plan, default_plan
from server.discovery import ClientInfo
from server.strategy import Assignment


def base_plan(settings: RunSettings) -> TrainingPlan:
    """The data set's default plan with the run's overrides; the LR decays over the
    rounds exactly as ``simulations.centralized`` decays it over the epochs."""
    return default_plan(
        settings.dataset, model=settings.model, lot_size=settings.lot_size, lr=settings.lr,
        max_grad_norm=settings.max_grad_norm, noise_multiplier=settings.noise_multiplier,
        lr_schedule=settings.lr_schedule, local_epochs=settings.local_epochs, lr_decay_rounds=settings.rounds,
    )


def assign(settings: RunSettings, clients: Mapping[int, ClientInfo]) -> dict[int, Assignment]:
    """Node id → the client's assignment (plan as config, and the events per round)."""
    base = base_plan(settings)
    plans: dict[int, TrainingPlan] = {}  # by N: equal-sized clients share one calibration
    nodes = {}
    for node, info in clients.items():
        plan = plans.get(info.num_examples, base)
        if settings.target_epsilon is not None and info.num_examples not in plans:
            plan = plans[info.num_examples] = calibrate_plan(
                base, settings.target_epsilon, settings.delta, info.num_examples, rounds=settings.rounds
            )
        nodes[node] = Assignment(
            client_id=info.client_id, num_examples=info.num_examples,
            config=protocol.plan_config(plan),
            events=plan.round_events(info.num_examples),
        )
    return nodes
