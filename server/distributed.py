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
import time
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.distributed.contribution import decode_sum
from fedpriv.distributed.setup import DistributedSetup, distributed_setup
from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import epsilon_of
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import ComposedEvent, DpEvent, GaussianEvent
from fedpriv.secagg import SecureSumResult, graph
from fedpriv.task import run_model
from fedpriv.training import TrainingPlan
from fedpriv.training.local import make_optimizer
from server.assign import Assignment
from server.history import History, RoundLog
from server.ledger import ServerLedger
from server.secure_sum import secure_sum
from server.strategy import BudgetedFedAvg


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


def record_survivors(round_log: RoundLog, result: SecureSumResult, cohort: Sequence[int],
                     nodes: Mapping[int, Assignment]) -> None:
    """The round's survivors, and why each other member of the ``cohort`` is not one."""
    for node in cohort:
        if node not in result.survivors:
            round_log.failed[nodes[node].client_id] = result.dropped.get(node, "not among the survivors")
    round_log.survivors = [nodes[n].client_id for n in result.survivors]


class DistributedFedAvg(BudgetedFedAvg):
    """Budget-aware sampling and booking (``BudgetedFedAvg``) of the nominal distributed
    event; each round one secure sum and one optimizer step on the server's model."""

    def __init__(self, ledger: ServerLedger, nodes: Mapping[int, Assignment], history: History, run_key: str,
                 distributed: DistributedSetup, model: torch.nn.Module, **kwargs: object) -> None:
        self.distributed = distributed
        super().__init__(ledger, nodes, history, run_key, **kwargs)  # type: ignore[arg-type]
        self.model = model
        self._optimizer: torch.optim.Optimizer | None = None
        self._epoch = 0

    def resolved(self) -> dict[str, object]:
        """The distributed setup (``DistributedSetup.resolved``)."""
        return self.distributed.resolved()

    def _add(self, node: int, assignment: Assignment) -> None:
        """Every node runs the run's one distributed plan (its σ is the cohort's, not its own)."""
        super()._add(node, dataclasses.replace(assignment, plan=self.distributed.plan))

    def round_charge(self, assignment: Assignment, entry: str, evaluate: bool = False) -> Charge:
        """Training rounds cost the nominal distributed event; evaluation as in local mode."""
        return assignment.charge(entry, evaluate) if evaluate else Charge(entry, self.distributed.events)

    def run_round(self, grid: Grid, server_round: int, arrays: ArrayRecord, timeout: float) -> ArrayRecord:
        """Sample and book the cohort, securely sum its contributions, step; the new model
        (the old one when the round is discarded: too few survivors)."""
        self._round_start = time.perf_counter()
        self._admit_new(grid, set(grid.get_node_ids()))
        cohort = self._sample_and_book(server_round, grid, evaluate=False)
        round_log = self.history.start_round(server_round, [self.nodes[n].client_id for n in cohort])
        entry = protocol.train_entry(self.run_key, server_round)
        lattice = self.distributed.round_lattice([self.nodes[n].num_examples for n in cohort])  # late joiners too
        config = ConfigRecord({**self.distributed.config(lattice), protocol.SERVER_ROUND: server_round,
                               protocol.RUN_KEY: self.run_key})
        neighbours = self.distributed.secagg_neighbours
        result = secure_sum(
            grid, cohort, dimension=lattice.dimension,
            modulus_bits=lattice.modulus_bits, threshold=graph.threshold(len(cohort), neighbours),
            neighbours=neighbours,
            collect_content=lambda node: RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}),
            timeout=timeout, round_key=entry,
        )
        record_survivors(round_log, result, cohort, self.nodes)
        ledger = self.ledger.snapshot()
        round_log.epsilon = {a.client_id: ledger.spent(a.client_id) for a in self.nodes.values()}
        round_log.train_seconds = time.perf_counter() - self._round_start
        if result.sum is None:
            round_log.discarded = f"secure aggregation gave no sum: {result.reason}; the previous model is kept"
            log(WARNING, "Round %d: %s", server_round, round_log.discarded)
            return arrays
        expected_lot = self.distributed.sample_rate * sum(self.nodes[n].weight for n in result.survivors)
        log(INFO, "Round %d: secure sum of %d of %d nodes; one step on an expected lot of %.1f",
            server_round, len(result.survivors), len(cohort), expected_lot)
        return self._step(server_round, arrays, decode_sum(result.sum, lattice) / expected_lot)

    def _step(self, server_round: int, arrays: ArrayRecord, gradient: torch.Tensor) -> ArrayRecord:
        """One optimizer step of the global model along ``gradient`` (flat, in
        ``named_parameters`` order); a fresh optimizer each epoch, as the centralized run."""
        self.model.load_state_dict(arrays.to_torch_state_dict())
        epoch = (server_round - 1) // self.distributed.steps_per_epoch + 1
        if self._optimizer is None or epoch != self._epoch:
            self._optimizer, self._epoch = make_optimizer(self.model, self.distributed.plan, epoch), epoch
        offset = 0
        for param in self.model.parameters():
            size = param.numel()
            param.grad = gradient[offset:offset + size].reshape(param.shape).to(param.dtype)
            offset += size
        self._optimizer.step()
        return ArrayRecord(self.model.state_dict())
