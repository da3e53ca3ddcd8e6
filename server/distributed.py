"""Distributed DP rounds (``privacy = "distributed"``): each round is one DP-SGD step on the
union of the cohort's data, and the server sees only the noisy sum.

Each sampled node draws its own Poisson lot at the shared rate q, clips and rounds each
example's gradient onto the integer lattice, adds its share of discrete Gaussian noise and
sends the result through secure aggregation (``server.secure_sum``). The server decodes
the modular sum, divides it by the public expected lot q·ΣN (the survivors' released N)
and steps its optimizer, exactly as ``simulations.centralized`` steps on the union: the
same σ, C, lot, LR schedule and momentum (a fresh optimizer each epoch of
``steps_per_epoch(q)`` rounds).

The server's ledger books the *nominal* event: a cohort of K shares that together carry
σ·C (``DistributedSetup.events``). Each node books, in its own ledger, the event its own
policy guarantees (``clients.distributed``); that one is the guarantee.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord
from flwr.supercore import log

from fedpriv.distributed.lattice import Lattice
from fedpriv.distributed.setup import DistributedSetup, distributed_setup
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import epsilon_of
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import ComposedEvent, DpEvent, GaussianEvent
from fedpriv.task import run_model
from fedpriv.training import TrainingPlan
from fedpriv.training.local import make_optimizer
from server.assign import Assignment
from server.booking import Sample
from server.collect import SecureSum
from server.mechanism import Booking, Collected, Round


def setup(settings: RunSettings, plan: TrainingPlan, nodes: Mapping[int, Assignment],
          releases: Sequence[tuple[DpEvent, ...]] = ()) -> DistributedSetup:
    """The run's setup for the discovered ``nodes`` (``distributed_setup``): their released
    N's (capped), the nominal cohort K = len(nodes), ``rounds`` DP-SGD steps, σ calibrated
    beside the costliest of the nodes' earlier ``releases`` (their DP counts of N), the lot
    ``large_lot``'s unless the run names one, SecAgg+ on
    the run's ``secagg-neighbours``; the modulus for their released N's, uncapped, and the
    largest noise of those counts (``lot_bound``)."""
    if not nodes:
        raise ValueError("no node described itself: nothing to aggregate")
    prior = max(releases, key=lambda events: epsilon_of(ComposedEvent(events), settings.delta), default=())
    count_noise = max((e.noise_multiplier for events in releases for e in events if isinstance(e, GaussianEvent)),
                      default=0.0)
    return dataclasses.replace(
        distributed_setup(plan, sum(a.weight for a in nodes.values()), len(nodes), settings.rounds,
                          settings.target_epsilon, settings.delta, settings.lattice_rounding, prior,
                          [a.num_examples for a in nodes.values()], count_noise,
                          choose_lot=settings.lot_size is None,
                          dimension=sum(p.numel() for p in run_model(plan.model, 0, settings.task).parameters())),
        secagg_neighbours=settings.secagg_neighbours)


EPOCH, OPTIMIZER = "epoch", "optimizer/"
"""The keys of ``DistributedDpSgd.state`` in the checkpoint: the epoch, and each optimizer
state tensor as ``optimizer/<parameter index>/<name>``."""


def optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """``optimizer``'s state dict with the per-parameter tensors of a checkpoint's ``state``."""
    tensors: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if key.startswith(OPTIMIZER):
            index, name = key.removeprefix(OPTIMIZER).split("/", 1)
            tensors.setdefault(int(index), {})[name] = torch.as_tensor(value)
    return {**optimizer.state_dict(), "state": tensors}


class DistributedDpSgd:
    """The parts of a distributed round: a sample booked the nominal event, the secure sum
    on the round's lattice, one optimizer step on the server's model."""

    def __init__(self, setup: DistributedSetup, model: torch.nn.Module, fraction_train: float = 1.0,
                 seed: int = 0, resumed: Mapping[str, Any] | None = None) -> None:
        self.setup, self.model = setup, model
        self.sample = Sample(fraction_train, seed, self.charge)
        self.collector = SecureSum(self.round_lattice, setup.secagg_neighbours)
        self._lattice = setup.lattice
        self._optimizer: torch.optim.Optimizer | None = None
        self._epoch = 0
        self._resumed = dict(resumed or {})  # the optimizer state of the epoch a resumed run is in

    def charge(self, assignment: Assignment, entry: str) -> Charge:
        """What a training round costs every client: the nominal distributed event."""
        return Charge(entry, self.setup.events)

    def assigned(self, assignment: Assignment) -> Assignment:
        """Every node runs the run's one distributed plan (its σ is the cohort's, not its own)."""
        return dataclasses.replace(assignment, plan=self.setup.plan)

    def book(self, booking: Booking) -> list[int]:
        return self.sample.book(booking)

    def opened(self, rnd: Round) -> None:
        """Fix the round's lattice: the modulus its cohort's sum cannot wrap (late joiners too)."""
        self._lattice = self.setup.round_lattice([a.num_examples for a in rnd.cohort.values()])

    def round_lattice(self, rnd: Round) -> Lattice:
        return self._lattice

    def train_config(self, rnd: Round, assignment: Assignment) -> dict[str, Any]:
        """The run's plan, q and the round's lattice (the same for every node)."""
        return self.setup.config(self._lattice)

    def update(self, rnd: Round, collected: Collected) -> ArrayRecord | None:
        """One step along the decoded sum / the public expected lot q·ΣN of the survivors."""
        if collected.decoded is None:
            rnd.log.discarded = f"{collected.reason}; the previous model is kept"
            log(WARNING, "Round %d: %s", rnd.number, rnd.log.discarded)
            return None
        expected_lot = self.setup.sample_rate * sum(a.weight for a in collected.survivors)
        log(INFO, "Round %d: secure sum of %d of %d nodes; one step on an expected lot of %.1f",
            rnd.number, len(collected.survivors), len(rnd.cohort), expected_lot)
        return self._step(rnd.number, rnd.arrays, collected.decoded / expected_lot)

    def _step(self, server_round: int, arrays: ArrayRecord, gradient: torch.Tensor) -> ArrayRecord:
        """One optimizer step of the global model along ``gradient`` (flat, in
        ``named_parameters`` order); a fresh optimizer each epoch, as the centralized run."""
        self.model.load_state_dict(arrays.to_torch_state_dict())
        epoch = (server_round - 1) // self.setup.steps_per_epoch + 1
        if self._optimizer is None or epoch != self._epoch:
            self._optimizer, self._epoch = make_optimizer(self.model, self.setup.plan, epoch), epoch
            if self._resumed.pop(EPOCH, None) == epoch:  # the momentum of the epoch's earlier rounds
                self._optimizer.load_state_dict(optimizer_state(self._optimizer, self._resumed))
            self._resumed = {}
        offset = 0
        for param in self.model.parameters():
            size = param.numel()
            param.grad = gradient[offset:offset + size].reshape(param.shape).to(param.dtype)
            offset += size
        self._optimizer.step()
        return ArrayRecord(self.model.state_dict())

    def state(self) -> dict[str, Any]:
        """The optimizer's state within the current epoch (its momentum: a run resumed mid-epoch
        steps as the uninterrupted one); the sampling is drawn per round."""
        if self._optimizer is None:
            return {}
        return {EPOCH: self._epoch, **{f"{OPTIMIZER}{index}/{name}": value.numpy(force=True).copy()
                                       for index, values in self._optimizer.state_dict()["state"].items()
                                       for name, value in values.items() if isinstance(value, torch.Tensor)}}

    def resolved(self) -> dict[str, Any]:
        """The distributed setup (``DistributedSetup.resolved``)."""
        return self.setup.resolved()
