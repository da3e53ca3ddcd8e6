"""What happened in a run, round by round, and its ``results.json`` form.

``results.json`` opens with what a reader looks for first: ``settings`` (as given),
``resolved`` (what they resolved to: model, accountant, δ, budget, each client's σ, q and
steps per round), ``final_accuracy`` and ``final_epsilon``; then the per-client plans and
the rounds. Clients are listed in numeric order ("0", "1", …, "10").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedpriv.files import write_json_atomic


def client_order(client_id: str) -> tuple[int, int, str]:
    """Sort key of client ids: numeric ids by value ("2" before "10"), then the others."""
    numeric = client_id.isascii() and client_id.isdigit()
    return (0, int(client_id), client_id) if numeric else (1, 0, client_id)


def by_client(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with its client-id keys in ``client_order``."""
    return {k: values[k] for k in sorted(values, key=client_order)}


MANY_CLIENTS = 10
"""Past this many clients, ε is summarised (``epsilon_summary``: min, median, max) instead of listed."""


def epsilon_text(epsilon: float) -> str:
    """ε for a reader: 4 decimals, or 4 significant digits below 0.1, so that a small ε is
    never printed as zero (``0.0000``)."""
    return f"{epsilon:.4f}" if epsilon >= 0.1 or epsilon == 0 else f"{epsilon:.4g}"


def epsilon_summary(epsilons: Iterable[float], randomness: str | None = None) -> str:
    """One line for many clients' ε: how many, and their min / median / max; with the nodes'
    ``randomness`` where the caller knows it (seeded noise is weaker than its ε says)."""
    eps = sorted(float(e) for e in epsilons)
    line = "no client has spent privacy" if not eps else (
        f"{len(eps)} clients, min {epsilon_text(eps[0])}, median {epsilon_text(statistics.median(eps))}, "
        f"max {epsilon_text(eps[-1])}")
    return line if randomness is None else f"{line} (node randomness: {randomness})"


@dataclass
class RoundLog:
    """One round: who was sampled, who refused/failed or was rejected, ε after it, and why
    the round's updates were discarded, if they were."""

    round: int
    participants: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    epsilon: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, Any] = field(default_factory=dict)
    train_seconds: float | None = None  # sampling, client training and booking, not evaluation
    test_accuracy: float | None = None
    test_loss: float | None = None
    federated_evaluation: dict[str, Any] = field(default_factory=dict)
    discarded: str | None = None  # why no update was aggregated although some passed (accept-failures)
    survivors: list[str] | None = None  # distributed mode: whose contributions the secure sum holds


@dataclass
class History:
    """The run's record; ``to_json`` is what ``results.json`` holds."""

    settings: dict[str, Any]
    run_key: str = ""
    resolved: dict[str, Any] = field(default_factory=dict)  # set by the run (``server.run``)
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    initial: dict[str, float] = field(default_factory=dict)
    rounds: list[RoundLog] = field(default_factory=list)
    stopped: str | None = None
    spent: dict[str, float] = field(default_factory=dict)
    wall_time_s: float | None = None
    discovery_seconds: float | None = None  # until every node described itself (or failed to)
    model_sha256: str | None = None

    def start_round(self, server_round: int, participants: list[str]) -> RoundLog:
        """A new round's log, appended to ``rounds``."""
        log = RoundLog(server_round, sorted(participants, key=client_order))
        self.rounds.append(log)
        return log

    def record_evaluation(self, server_round: int, loss: float, accuracy: float) -> None:
        """Centralized test metrics after ``server_round`` (0: the initial model)."""
        if server_round == 0:
            self.initial = {"test_loss": loss, "test_accuracy": accuracy}
            return
        log = next(r for r in self.rounds if r.round == server_round)
        log.test_loss, log.test_accuracy = loss, accuracy

    def final_epsilon(self) -> dict[str, float]:
        """Each client's ε in the server's ledger at the end (``spent``, set by the run:
        with a state dir it includes earlier runs), else after the last round that ran."""
        if self.spent:
            return dict(self.spent)
        return dict(self.rounds[-1].epsilon) if self.rounds else {}

    def final_accuracy(self) -> float | None:
        """The central test accuracy after the last round that ran; None if none ran (the
        initial model's, in ``initial``, is no result)."""
        for log in reversed(self.rounds):
            if log.test_accuracy is not None:
                return log.test_accuracy
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (ε = ∞ is written as the string "inf"): the summary
        first, clients in numeric order."""
        data = asdict(self)
        for log in data["rounds"]:
            for key in ("epsilon", "failed", "rejected"):
                log[key] = by_client(log[key])
        ordered = {
            "settings": data["settings"],
            "resolved": data["resolved"],
            "run_key": data["run_key"],
            "final_accuracy": self.final_accuracy(),
            "final_epsilon": by_client(self.final_epsilon()),
            "stopped": data["stopped"],
            "wall_time_s": data["wall_time_s"],
            "model_sha256": data["model_sha256"],
            "initial": data["initial"],
            "clients": by_client(data["clients"]),
            "spent": by_client(data["spent"]),
            "rounds": data["rounds"],
        }
        ordered.update({k: v for k, v in data.items() if k not in ordered})
        return _finite(ordered)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        """Inverse of ``to_json`` (a checkpoint's history)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        rounds = [RoundLog(**{**r, "epsilon": {c: float(e) for c, e in r["epsilon"].items()}})
                  for r in fields.pop("rounds", [])]
        spent = {c: float(e) for c, e in fields.pop("spent", {}).items()}
        return cls(**fields, rounds=rounds, spent=spent)

    def save(self, path: Path) -> None:
        """Write ``results.json`` atomically (temp file + ``os.replace``)."""
        write_json_atomic(path, self.to_json())


def _finite(value: Any) -> Any:
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
