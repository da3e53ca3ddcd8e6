"""Each client's plan: the data set's default, the run's overrides, and its own σ.

By default the plan's lot is shared out among the clients: every client samples at the
centralized rate q = lot_size / ΣN (``shared_sample_rate``), so its expected lot is its
share q·N of the plan's lot and all clients spend one event. With a ``lot-size`` in the
run every client uses that lot and q = lot / N differs between clients. In target-ε mode
σ is calibrated once per distinct (q, earlier releases), so that those releases (a DP
count of N) and ``rounds`` rounds of the event end at ≤ ``target-epsilon``.

The N here are what clients *released*, so none can be trusted to be honest: in ΣN and
as a FedAvg weight each counts at most ``SIZE_CAP`` (``fedpriv.training.plan``) times the lower median of the sizes
the first discovery found. One client can thus lower the others' shared q by a factor of
at most 1 + SIZE_CAP·m/Σ_others (m: the lower median), and can never raise it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.model_names import TASK_MODEL
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import DpEvent
from fedpriv.training import TrainingPlan, calibrate_plan, default_plan
from fedpriv.training.plan import shared_plan
from fedpriv.training.plan import size_cap as _size_cap
from server.discovery import ClientInfo


@dataclass(frozen=True)
class Assignment:
    """What one client is told to run each round, what that costs, and its FedAvg weight.
    The plan is the one source: the config sent and the events booked are read off it."""

    client_id: str
    num_examples: int
    plan: TrainingPlan
    weight: float
    evaluate_events: tuple[DpEvent, ...] = ()

    @property
    def config(self) -> Mapping[str, str | int | float]:
        """The plan as the TRAIN message carries it."""
        return protocol.plan_config(self.plan)

    @property
    def events(self) -> tuple[DpEvent, ...]:
        """What one round costs the client (its released N): booked when the round is sent."""
        return self.plan.round_events(self.num_examples)

    def charge(self, entry: str, evaluate: bool = False) -> Charge:
        """What ``entry`` (a training round, or an evaluation) costs the client."""
        return Charge(entry, self.evaluate_events if evaluate else self.events)


def base_plan(settings: RunSettings) -> TrainingPlan:
    """The data set's default plan with the run's overrides; the LR decays over the
    rounds exactly as ``simulations.centralized`` decays it over the epochs."""
    return default_plan(
        settings.dataset if settings.task is None else TASK_MODEL, model=settings.model, lot_size=settings.lot_size,
        lr=settings.lr,
        max_grad_norm=settings.max_grad_norm, noise_multiplier=settings.noise_multiplier,
        lr_schedule=settings.lr_schedule, local_epochs=settings.local_epochs, lr_decay_rounds=settings.rounds,
        max_physical_batch_size=settings.max_physical_batch,
    )


def size_cap(clients: Mapping[int, ClientInfo]) -> float:
    """``SIZE_CAP`` × the lower median of the clients' sizes (∞ without clients)."""
    return _size_cap([info.num_examples for info in clients.values()])


class Assigner:
    """Node id → assignment for the clients of one run. The shared q and the size cap are
    fixed by the clients of the first discovery; clients that join later sample at that
    same q. One calibration per distinct (q, earlier releases), cached for the run.
    """

    def __init__(self, settings: RunSettings, clients: Mapping[int, ClientInfo]) -> None:
        plan = base_plan(settings)
        self.cap = size_cap(clients)
        if settings.lot_size is None and clients:
            plan = shared_plan(plan, [info.num_examples for info in clients.values()])
        self.settings = settings
        self.plan = plan
        self._calibrations: dict[tuple[float, tuple[DpEvent, ...]], TrainingPlan] = {}

    def __call__(self, clients: Mapping[int, ClientInfo]) -> dict[int, Assignment]:
        nodes = {}
        for node, info in clients.items():
            nodes[node] = Assignment(
                client_id=info.client_id, num_examples=info.num_examples, plan=self._calibrated(info),
                weight=float(min(info.num_examples, self.cap)), evaluate_events=info.evaluate_events,
            )
        return nodes

    def _calibrated(self, info: ClientInfo) -> TrainingPlan:
        """The run's plan with σ calibrated for this client's q and earlier releases (cached)."""
        q = self.plan.sample_rate(info.num_examples)
        prior = tuple(e for events in info.releases.values() for e in events)
        if (q, prior) not in self._calibrations:
            target = self.settings.target_epsilon
            self._calibrations[q, prior] = self.plan if target is None else calibrate_plan(
                self.plan, target, self.settings.delta, info.num_examples, rounds=self.settings.rounds,
                prior_events=prior,
            )
        return self._calibrations[q, prior]
