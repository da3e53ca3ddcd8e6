"""One federated run: discover clients, assign plans, run budget-aware FedAvg round by
round (checkpointing after each when there is a state dir), report.

Its terminal output is ``server.progress``. ``results.json`` adds
to the settings what they resolved to (``resolved``: model, accountant, δ, budget, and each
client's σ, q and steps per round).

The round loop is fedpriv's own rather than ``Strategy.start``'s so that a killed run can
``resume`` from its last completed round with the same run key: rounds it re-sends are
booked under the same entries, so nothing is counted twice.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.data import default_data_dir, load_dataset
from fedpriv.federation.settings import RunSettings, SettingsError
from fedpriv.models import model_inputs, model_sha256
from fedpriv.privacy import Budget, BudgetExceededError, LedgerError
from fedpriv.privacy.events import DpEvent
from fedpriv.task import evaluate_task, load_task, run_model
from fedpriv.training import TrainingPlan, evaluate
from server.assign import Assigner, Assignment
from server.booking import BudgetExhausted
from server.discovery import ClientInfo, describe_nodes, discover
from server.history import History, by_client, epsilon_summary
from server.ledger import ServerLedger
from server.modes import Start, mode
from server.progress import Progress
from server.state import Checkpoint, ServerState
from server.strategy import PrivateFedAvg

LATE_NODE_TIMEOUT_S = 120.0
"""How long a round waits for nodes that connected since the last one to describe themselves."""

NOT_RESUMED = frozenset({"resume", "out", "round_timeout"})
"""Settings a resumed run may change; every other one must equal the checkpoint's."""


def run_server(grid: Grid, run_config: Mapping[str, Any]) -> History:
    """Run ``rounds`` rounds (fewer when budgets run out); write ``out`` when set."""
    start = time.perf_counter()
    settings = RunSettings.from_run_config(run_config)
    out = Path(settings.out) if settings.out else None
    state = ServerState(settings.state_dir) if settings.state_dir else None
    ledger = ServerLedger(Budget(epsilon=settings.server_budget, delta=settings.delta),
                          state.ledger_path if state else None)
    if state is None:
        log(WARNING, "No state-dir: the server's ledger lasts this run only (nodes keep their own)")
    discovered = discover(grid, min_nodes=settings.min_clients)
    discovery_seconds = time.perf_counter() - start
    book_releases(ledger, discovered.values())
    assigner = Assigner(mode(settings).assigned_settings(settings), discovered)

    def admit(g: Grid, node_ids: list[int]) -> dict[int, Assignment]:
        found = describe_nodes(g, node_ids, LATE_NODE_TIMEOUT_S)
        book_releases(ledger, found.values())
        return assigner(found)

    model_name = assigner.plan.model
    model = run_model(model_name, settings.seed, settings.task)
    history, run_key, first, arrays, resumed = _start(settings, state, model)
    history.discovery_seconds = discovery_seconds
    strategy = _strategy(settings, ledger, assigner(discovered), history, run_key, assigner.plan, admit,
                         [e for info in discovered.values() for e in info.releases.values()], resumed)
    evaluate_fn = _central_evaluation(settings, history, model_name, model)
    with Progress(settings.rounds, done=first - 1) as progress:
        if first == 1:
            evaluate_fn(0, arrays)
            progress.initial(history)
            if state:  # the run key is durable before anything is booked under it
                state.save(Checkpoint(run_key, 0, history.settings, history.to_json(), strategy.state()), arrays)
        for server_round in range(first, settings.rounds + 1):
            progress.start()
            try:
                arrays = _round(grid, strategy, server_round, arrays, model_name, settings.round_timeout)
            except BudgetExhausted as stop:
                history.stopped = str(stop)
                if not strategy.nodes:
                    log(WARNING, "Nothing to train: no node described itself (each refused or failed; see above)")
                elif server_round == 1:
                    log(WARNING, "Nothing to train: all %d clients have spent their budget", len(strategy.nodes))
                else:
                    log(WARNING, "Stopping: %s", stop)
                break
            evaluate_fn(server_round, arrays)
            if state:
                state.save(Checkpoint(run_key, server_round, history.settings, history.to_json(), strategy.state()),
                           arrays)
            if out:
                ledger.snapshot().save(out / "ledger.json")
            progress.round_done(history.rounds[-1])
    model.load_state_dict(arrays.to_torch_state_dict())
    spent = ledger.snapshot()
    history.spent = {a.client_id: spent.spent(a.client_id) for a in strategy.nodes.values()}
    history.model_sha256 = model_sha256(model)
    history.resolved = resolved(ledger, assigner, strategy.nodes.values()) | strategy.resolved()
    history.wall_time_s = time.perf_counter() - start
    log(INFO, "Final ε: %s", epsilon_summary(history.final_epsilon().values()))
    if out:
        history.save(out / "results.json")
        if not (out / "ledger.json").exists():
            ledger.snapshot().save(out / "ledger.json")
    return history


def _strategy(settings: RunSettings, ledger: ServerLedger, nodes: dict[int, Assignment], history: History,
              run_key: str, plan: TrainingPlan, admit: Callable[[Grid, list[int]], dict[int, Assignment]],
              releases: Sequence[tuple[DpEvent, ...]] = (),
              resumed: dict[str, Any] | None = None) -> PrivateFedAvg:
    """The one round loop with the run's mode as its parts (``server.modes``). ``resumed``:
    the checkpoint's ``strategy`` state of a resumed run."""
    mechanism = mode(settings).mechanism(Start(settings, nodes, plan, releases, resumed))
    return PrivateFedAvg(ledger, nodes, history, run_key, mechanism, fraction_evaluate=settings.fraction_evaluate,
                         seed=settings.seed, admit=admit, accept_failures=settings.accept_failures)


def _start(settings: RunSettings, state: ServerState | None,
           model: torch.nn.Module) -> tuple[History, str, int, ArrayRecord, dict[str, Any] | None]:
    """(history, run key, first round, global model, the strategy's state: None for a new run)
    of a new run or of the one resumed."""
    plain = {k: _plain(v) for k, v in asdict(settings).items()}
    if not settings.resume:
        run_key = f"run-{secrets.token_hex(6)}"
        return History(settings=plain, run_key=run_key), run_key, 1, ArrayRecord(model.state_dict()), None
    assert state is not None  # RunSettings requires a state dir to resume
    checkpoint, arrays = state.load()
    changed = sorted(k for k in plain.keys() | checkpoint.settings.keys()
                     if k not in NOT_RESUMED and plain.get(k) != checkpoint.settings.get(k))
    if changed:
        raise SettingsError("resume must keep the run's settings; these differ from the checkpoint: "
                            f"{', '.join(changed)}")
    log(INFO, "Resuming %s after round %d of %d", checkpoint.run_key, checkpoint.completed_round, settings.rounds)
    history = History.from_json(checkpoint.history)
    history.settings = plain
    return history, checkpoint.run_key, checkpoint.completed_round + 1, arrays, checkpoint.strategy


def _round(grid: Grid, strategy: PrivateFedAvg, server_round: int, arrays: ArrayRecord, model_name: str,
           timeout: float) -> ArrayRecord:
    """One round of training (and federated evaluation where asked); the new global model.
    Replies later than ``timeout`` seconds are not waited for: that node failed the round."""
    arrays = strategy.run_round(grid, server_round, arrays, timeout)
    strategy.evaluate_round(grid, server_round, arrays, model_name, timeout)
    return arrays


def book_releases(ledger: ServerLedger, clients: Iterable[ClientInfo]) -> None:
    """Book what the clients' descriptions cost them (their DP counts), idempotently."""
    with ledger.transaction() as book:
        for info in clients:
            for entry, events in info.releases.items():
                try:
                    book.record(info.client_id, entry, events)
                except (LedgerError, BudgetExceededError) as err:
                    log(WARNING, "Client %s: release %s not booked: %s", info.client_id, entry, err)


def resolved(ledger: ServerLedger, assigner: Assigner, nodes: Iterable[Assignment]) -> dict[str, Any]:
    """What the settings resolved to: the model and plan every client was given, how ε is
    accounted (the server ledger's accountant, δ and per-client budget), and each client's
    σ, q (sampling rate), expected lot q·N and DP-SGD steps per round."""
    plan = assigner.plan
    clients = {
        a.client_id: {
            "noise_multiplier": a.plan.noise_multiplier,
            "sample_rate": a.plan.sample_rate(a.num_examples),
            "expected_lot_size": a.plan.sample_rate(a.num_examples) * a.num_examples,
            "steps_per_round": a.plan.steps_per_round(a.num_examples),
        }
        for a in nodes
    }
    return {
        "model": plan.model,
        "accountant": ledger.accountant.value,
        "delta": ledger.budget.delta,
        "epsilon_budget": ledger.budget.epsilon,
        "lot_size": plan.lot_size,
        "shared_sample_rate": plan.shared_sample_rate,
        "max_grad_norm": plan.max_grad_norm,
        "lr": plan.lr,
        "lr_schedule": _plain(plan.lr_schedule),
        "local_epochs": plan.local_epochs,
        "clients": by_client(clients),
    }


def _central_evaluation(
    settings: RunSettings, history: History, model_name: str, model: torch.nn.Module
) -> Callable[[int, ArrayRecord], MetricRecord]:
    """``evaluate_fn`` on the test set (as ``model_name``'s inputs; of a user's task, the test
    set its ``load_data`` reads from the server's own ``data-dir``, by its ``loss`` and
    ``metrics``); it loads each global model into ``model``."""
    if settings.task is not None:
        task = load_task(settings.task)
        _, test = task.load(0, 1, Path(settings.data_dir) if settings.data_dir else default_data_dir())
        score = functools.partial(evaluate_task, task, model, test)
    else:
        test = load_dataset(settings.dataset, settings.data_dir, train=False,
                            download=settings.download, limit=settings.limit_test)
        score = functools.partial(evaluate, model, model_inputs(model_name, test.features), test.labels)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = score()
        history.record_evaluation(server_round, loss, accuracy)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_fn


def _plain(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value
