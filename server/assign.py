"""Each client's plan: the data set's default, the run's overrides, and its own σ.

By default each client's lot is its share of the plan's lot (``shared_lot``), so all
sample at one rate q; with a ``lot-size`` in the run every client uses that lot and
q = lot / N differs between clients. In target-ε mode σ is calibrated per client from
its own N and q, so that ``rounds`` rounds of its event end at ≤ ``target-epsilon``: R
rounds of ``dpsgd_event(σ, q, s)`` compose exactly like one ``dpsgd_event(σ, q, R·s)``.
"""

from __future__ import annotations

import dataclasses
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


def shared_lot(lot_size: int, num_examples: int, total_examples: int) -> int:
    """A client's share of ``lot_size``, in proportion to its data: every client samples at
    the centralized rate q = lot_size / total, and the lots add up to about ``lot_size``."""
    return max(1, round(lot_size * num_examples / total_examples))


def assign(settings: RunSettings, clients: Mapping[int, ClientInfo]) -> dict[int, Assignment]:
    """Node id → the client's assignment (plan as config, and the events per round).

    Without a ``lot-size`` in the run, the default plan's lot is shared out in proportion
    to the clients' N (``shared_lot``); one client keeps it whole, as centralized training.
    """
    base = base_plan(settings)
    total = sum(info.num_examples for info in clients.values())
    plans: dict[int, TrainingPlan] = {}  # by N: equal-sized clients share one plan and calibration
    nodes = {}
    for node, info in clients.items():
        n = info.num_examples
        if n not in plans:
            plan = base
            if settings.lot_size is None:
                plan = dataclasses.replace(plan, lot_size=shared_lot(base.lot_size, n, total))
            if settings.target_epsilon is not None:
                plan = calibrate_plan(plan, settings.target_epsilon, settings.delta, n, rounds=settings.rounds)
            plans[n] = plan
        nodes[node] = Assignment(
            client_id=info.client_id, num_examples=n,
            config=protocol.plan_config(plans[n]),
            events=plans[n].round_events(n),
        )
    return nodes
