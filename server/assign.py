"""Each client's plan: the data set's default, the run's overrides, and its own σ.

By default the plan's lot is shared out among the clients: every client samples at the
centralized rate q = lot_size / ΣN (``shared_sample_rate``), so its expected lot is its
share q·N of the plan's lot and all clients spend one event. With a ``lot-size`` in the
run every client uses that lot and q = lot / N differs between clients. In target-ε mode
σ is calibrated once per distinct q, so that ``rounds`` rounds of the event end at ≤
``target-epsilon``: R rounds of ``dpsgd_event(σ, q, s)`` compose exactly like one
``dpsgd_event(σ, q, R·s)``.
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


class Assigner:
    """Node id → assignment (plan as config, and the events per round) for the clients of
    one run. The shared q is fixed by the clients of the first discovery; clients that join
    later sample at that same q. One calibration per distinct q, cached for the run.
    """

    def __init__(self, settings: RunSettings, clients: Mapping[int, ClientInfo]) -> None:
        plan = base_plan(settings)
        if settings.lot_size is None and clients:
            total = sum(info.num_examples for info in clients.values())
            plan = dataclasses.replace(plan, shared_sample_rate=min(1.0, plan.lot_size / total))
        self.settings = settings
        self.plan = plan
        self._plans: dict[float, TrainingPlan] = {}  # by q, which fixes the steps and so σ

    def __call__(self, clients: Mapping[int, ClientInfo]) -> dict[int, Assignment]:
        nodes = {}
        for node, info in clients.items():
            plan = self._plan(info.num_examples)
            nodes[node] = Assignment(
                client_id=info.client_id, num_examples=info.num_examples,
                config=protocol.plan_config(plan), events=plan.round_events(info.num_examples),
            )
        return nodes

    def _plan(self, num_examples: int) -> TrainingPlan:
        q = self.plan.sample_rate(num_examples)
        if q not in self._plans:
            target = self.settings.target_epsilon
            self._plans[q] = self.plan if target is None else calibrate_plan(
                self.plan, target, self.settings.delta, num_examples, rounds=self.settings.rounds
            )
        return self._plans[q]
