"""One federated run: discover clients, assign plans, run budget-aware FedAvg, report."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log
from tqdm import tqdm

from clients import protocol
from clients.config import RunSettings
from fedpriv.data import load_dataset
from fedpriv.models import build_model, model_inputs
from fedpriv.privacy import Budget, PrivacyLedger
from fedpriv.training import evaluate, model_sha256
from server.assign import Assigner
from server.discovery import describe_nodes, discover
from server.history import History, epsilon_summary
from server.strategy import BudgetedFedAvg, BudgetExhausted


LATE_NODE_TIMEOUT_S = 120.0
"""How long a round waits for nodes that connected since the last one to describe themselves."""


def run_server(grid: Grid, run_config: Mapping[str, Any]) -> History:
    """Run ``rounds`` rounds (fewer when budgets run out); write ``out`` when set."""
    start = time.perf_counter()
    settings = RunSettings.from_run_config(run_config)
    out = Path(settings.out) if settings.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    history = History(settings={k: _plain(v) for k, v in asdict(settings).items()})
    discovered = discover(grid, min_nodes=settings.min_clients)
    assigner = Assigner(settings, discovered)
    ledger = PrivacyLedger(Budget(epsilon=settings.server_budget, delta=settings.delta), accountant="rdp")
    strategy = BudgetedFedAvg(
        ledger, assigner(discovered), history, ledger_path=out / "ledger.json" if out else None,
        fraction_train=settings.fraction_train, fraction_evaluate=settings.fraction_evaluate,
        seed=settings.seed, admit=lambda g, ids: assigner(describe_nodes(g, ids, LATE_NODE_TIMEOUT_S)),
    )
    model_name = assigner.plan.model
    model = build_model(model_name, settings.seed)
    with tqdm(total=settings.rounds, desc="rounds", unit="round", disable=None) as bar:
        evaluate_fn = _central_evaluation(settings, history, model_name, model, bar)
        try:
            strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                           num_rounds=settings.rounds, evaluate_fn=evaluate_fn,
                           evaluate_config=ConfigRecord({protocol.MODEL: model_name}))
        except BudgetExhausted as stop:
            history.stopped = str(stop)
    history.model_sha256 = model_sha256(model)  # evaluate_fn left the latest global model in it
    history.wall_time_s = time.perf_counter() - start
    log(INFO, "Final ε: %s", epsilon_summary(history.final_epsilon().values()))
    if out:
        history.save(out / "results.json")
    return history


def _central_evaluation(
    settings: RunSettings, history: History, model_name: str, model: torch.nn.Module, bar: tqdm
) -> Callable[[int, ArrayRecord], MetricRecord]:
    """``evaluate_fn`` on the test set (as ``model_name``'s inputs); it loads each global
    model into ``model``."""
    test = load_dataset(settings.dataset, settings.data_dir, train=False,
                        download=settings.download, limit=settings.limit_test)
    inputs = model_inputs(model_name, test.features)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, inputs, test.labels)
        history.record_evaluation(server_round, loss, accuracy)
        if server_round:
            bar.update(1)
            bar.set_postfix(accuracy=f"{accuracy:.4f}")
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_fn


def _plain(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value
