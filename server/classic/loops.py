"""Server side of the federated classic algorithms: ask every node for its noisy share of
a statistic, add the shares, and finish on the server (solve the regression; move the
centroids). Replies are untrusted: a refusal, a wrong shape, a non-finite value, or
events other than the ones the request costs drop that node's share from the sum.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.algorithms import dpdropout, dppca, iris, kmeans, linreg
from fedpriv.federation import protocol
from fedpriv.federation.classic_protocol import ARRAYS, CONFIG, VALUES, entry, flat_weights, load_flat_weights
from fedpriv.models import build_model
from fedpriv.privacy import calibrate_noise_multiplier
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import DpEvent, SelfComposedEvent, dpsgd_event
from fedpriv.training import cosine_lr
from server.exchange import send_and_receive


@dataclass
class Shares:
    """What one federated run gathered: the summed statistic per step, and per client the
    events its accepted replies booked (for the results; the node's ledger is the truth)."""

    events: dict[str, list[DpEvent]] = field(default_factory=dict)
    refused: dict[str, str | None] = field(default_factory=dict)  # a Flower error may carry no reason


def _ask(grid: Grid, config: Mapping[str, Any], arrays: Mapping[str, np.ndarray], size: int,
         expected: DpEvent, shares: Shares) -> tuple[np.ndarray, int]:
    """Send the request to every node; the sum of the valid replies' values, and their number."""
    content = RecordDict({CONFIG: ConfigRecord(dict(config)),
                          ARRAYS: ArrayRecord({k: Array(np.asarray(v, float)) for k, v in arrays.items()})})
    messages = [Message(content, dst_node_id=node, message_type=MessageType.QUERY) for node in grid.get_node_ids()]
    key = entry(str(config["run-key"]), str(config["algorithm"]), int(config["step"]))
    total, accepted = np.zeros(size), 0
    for reply in send_and_receive(grid, messages):
        node = str(reply.metadata.src_node_id)
        if reply.has_error():
            shares.refused[node] = reply.error.reason
            continue
        try:
            values = reply.content.array_records[VALUES][VALUES].numpy().astype(float)
            charge = protocol.read_charge(reply.content.config_records[protocol.PRIVACY])
        except (KeyError, TypeError, ValueError) as err:
            shares.refused[node] = f"malformed reply: {err}"
            continue
        if values.shape != (size,) or not np.all(np.isfinite(values)) or charge != Charge(key, (expected,)):
            shares.refused[node] = "reply does not match the request (shape, finiteness, entry or events)"
            log(WARNING, "Dropped the share of node %s: %s", node, shares.refused[node])
            continue
        shares.events.setdefault(node, []).append(expected)
        total += values
        accepted += 1
    return total, accepted


def federated_linreg(grid: Grid, dataset: str, seed: int, epsilon: float, bounds: linreg.Bounds,
                     quadratic_share: float = 0.5) -> tuple[np.ndarray, Shares]:
    """One release per node of its noisy coefficient sums; the weights solving their sum."""
    d = len(bounds.low)
    size = (d + 1) * (d + 2) // 2
    config = {"algorithm": "linreg", "dataset": dataset, "seed": seed, "epsilon": epsilon, "step": 0,
              "run-key": f"run-{secrets.token_hex(6)}", "quadratic-share": quadratic_share}
    arrays = {"low": bounds.low, "high": bounds.high, "target": np.array(bounds.target)}
    shares = Shares()
    total, _ = _ask(grid, config, arrays, size + d + 1, linreg.release_event(d, epsilon, quadratic_share), shares)
    summed = linreg.Coefficients(total[:size], total[size:])
    # each node's share carries its own noise: the sum's quadratic noise scale grows as √K
    scale = linreg.sensitivities(d)[0] / (epsilon * quadratic_share) * np.sqrt(max(1, len(shares.events)))
    return linreg.solve(summed, d, scale), shares


def federated_dplloyd(grid: Grid, dataset: str, seed: int, epsilon: float, k: int, box: kmeans.Box,
                      iterations: int = 3) -> tuple[np.ndarray, Shares]:
    """DPLloyd across nodes, as ``kmeans.dplloyd``: every node releases its noisy moments,
    whose sum sets the initial centroids, then each iteration its noisy (count, sum) per
    cluster; the server adds them and moves the centroids. Each release costs ε/(T + 1)."""
    run_key = f"run-{secrets.token_hex(6)}"
    share = kmeans.init_epsilon(epsilon, iterations)
    shares = Shares()
    request = {"dataset": dataset, "seed": seed, "epsilon": share, "run-key": run_key}
    bounds = {"low": box.low, "high": box.high}
    moments, _ = _ask(grid, {**request, "algorithm": "kmeans-moments", "step": 0}, bounds, 1 + 2 * len(box.low),
                      kmeans.moments_event(box, share), shares)
    centroids = kmeans.initial_centroids(moments, k, box, np.random.default_rng(seed))
    event = kmeans.release_event(k, box, share)
    for step in range(iterations):
        total, _ = _ask(grid, {**request, "algorithm": "kmeans-dplloyd", "step": step},
                        {**bounds, "centroids": centroids}, k * (1 + len(box.low)), event, shares)
        centroids = kmeans.update(total.reshape(k, -1), centroids, box)
    return centroids, shares


def _fedavg_round(grid: Grid, config: Mapping[str, Any], model: torch.nn.Module, expected: DpEvent,
                  shares: Shares, arrays: Mapping[str, np.ndarray] | None = None) -> None:
    """Send ``model``'s weights (and ``arrays``) with ``config``; replace them by the mean of
    the valid replies (each node's weights after its local training; unchanged if none is valid)."""
    weights = flat_weights(model)
    total, accepted = _ask(grid, config, {**(arrays or {}), "weights": weights}, len(weights), expected, shares)
    if accepted:
        load_flat_weights(model, total / accepted)


@dataclass(frozen=True)
class AnnPlan:
    """Federated DP-SGD of the iris network: ``rounds`` of ``local_epochs`` on each node's
    share, lots at rate ``sample_rate``; the expected lot size is q × the public share size."""

    rounds: int = 5
    local_epochs: int = 12
    sample_rate: float = 1.0  # each step on the whole share: docs/classic.md, "The federated ANN's q"
    max_grad_norm: float = 1.0
    lr: float = 0.3

    @property
    def steps(self) -> int:
        return int(round(self.local_epochs / self.sample_rate))


def federated_ann(grid: Grid, dataset: str, seed: int, epsilon: float, delta: float, share_size: float,
                  plan: AnnPlan = AnnPlan()) -> tuple[torch.nn.Module, Shares]:
    """FedAvg of the nodes' DP-SGD trainings; σ calibrated (RDP) so that every node's
    ``rounds`` trainings compose to ε at δ."""
    sigma = calibrate_noise_multiplier(epsilon, delta, plan.sample_rate, plan.rounds * plan.steps)
    model, run_key, shares = iris.network(seed), f"run-{secrets.token_hex(6)}", Shares()
    expected = dpsgd_event(sigma, plan.sample_rate, plan.steps)
    for step in range(plan.rounds):
        config = {"algorithm": "ann-iris", "dataset": dataset, "seed": seed, "step": step, "run-key": run_key,
                  "noise-multiplier": sigma, "sample-rate": plan.sample_rate, "steps": plan.steps,
                  "max-grad-norm": plan.max_grad_norm, "lr": plan.lr, "lot-size": plan.sample_rate * share_size}
        _fedavg_round(grid, config, model, expected, shares)
    return model, shares


def federated_answers(grid: Grid, dataset: str, seed: int, epsilon: float, queries: np.ndarray
                      ) -> tuple[np.ndarray, Shares]:
    """Every node answers every query with its own network's noisy softmax (ε per answer);
    the mean of the valid answers, shape (m, 3)."""
    config = {"algorithm": "output-perturbation", "dataset": dataset, "seed": seed, "epsilon": epsilon, "step": 0,
              "run-key": f"run-{secrets.token_hex(6)}"}
    shares = Shares()
    expected = SelfComposedEvent(iris.answer_event(epsilon), len(queries))
    total, accepted = _ask(grid, config, {"queries": queries}, 3 * len(queries), expected, shares)
    return total.reshape(len(queries), 3) / max(1, accepted), shares


def federated_dpdropout(grid: Grid, dataset: str, seed: int, settings: dpdropout.Settings, noise_multiplier: float,
                        share_size: float) -> tuple[torch.nn.Module, Shares]:
    """FedAvg of local DPD: ``settings.epochs`` rounds, each node training one local epoch
    (η_t = η0/t, t the round) from the server's weights at the fixed rate q of ``settings``
    with divisor q × the public ``share_size``; the model is the mean of the valid replies."""
    model = dpdropout.network(dpdropout.DIGITS_FEATURES, settings, seed)
    run_key, shares = f"run-{secrets.token_hex(6)}", Shares()
    q = settings.sample_rate(1)
    expected = dpsgd_event(noise_multiplier, q, settings.steps(1, epochs=1))
    for step in range(settings.epochs):
        config = {"algorithm": "dpdropout", "dataset": dataset, "seed": seed, "step": step, "run-key": run_key,
                  "method": settings.method, "hidden": settings.hidden, "noise-multiplier": noise_multiplier,
                  "sample-rate": q, "lot-size": q * share_size, "max-grad-norm": settings.max_grad_norm,
                  "lr": settings.lr, "dropout": settings.dropout}
        _fedavg_round(grid, config, model, expected, shares)
    return model, shares


@dataclass(frozen=True)
class DppcaTraining:
    """Federated DP-SGD of the DP-PCA MLP: ``rounds`` rounds, in each every node runs
    ``steps`` DP-SGD steps from the server's weights on its projected share, lots at rate
    ``sample_rate`` whose expected size is ``lot_size`` (q × the public share size, the
    noisy sum's divisor); LR ``lr`` decayed by a half cosine over the rounds (momentum 0.9,
    restarted every round). ``noise_multiplier`` is calibrated by the caller so that the
    PCA's event and all rounds compose to the node's ε."""

    rounds: int
    steps: int
    sample_rate: float
    lot_size: float
    noise_multiplier: float
    max_grad_norm: float
    lr: float

    def lr_at(self, round_: int) -> float:
        """The LR of round ``round_`` (1-based), decayed by a half cosine over the rounds."""
        return cosine_lr(self.lr, round_, self.rounds)

    @property
    def event(self) -> DpEvent:
        """What one round costs each node."""
        return dpsgd_event(self.noise_multiplier, self.sample_rate, self.steps)


def federated_dppca(grid: Grid, seed: int, noise_multiplier: float, sample_rate: float, dims: int, features: int,
                    limit_train: int | None = None, training: DppcaTraining | None = None,
                    after_round: Callable[[int, torch.nn.Module, torch.Tensor], None] | None = None,
                    ) -> tuple[torch.Tensor, torch.nn.Module | None, Shares]:
    """Abadi et al.'s DP-PCA across nodes: each releases its noisy Σ x xᵀ over its MNIST
    share (``features`` coordinates), read from the node's own data folder; the projection
    is the top-``dims`` eigenvectors of their sum (K noises). With ``training``, the MLP
    (dims → 1000 → 10, initialised from ``seed``) is then trained by FedAvg of the nodes'
    local DP-SGD on their projected shares, the projection sent with every round;
    ``after_round(r, model, projection)`` is called after each. Returns (projection, model or None, shares)."""
    run_key, shares = f"run-{secrets.token_hex(6)}", Shares()
    config = {"algorithm": "dppca", "seed": seed, "step": 0, "run-key": run_key,
              "noise-multiplier": noise_multiplier, "sample-rate": sample_rate, "limit-train": limit_train or 0}
    event = dppca.pca_event(noise_multiplier, sample_rate)
    total, accepted = _ask(grid, config, {}, features * features, event, shares)
    if not accepted:
        raise RuntimeError(f"no node released its matrix: {shares.refused}")
    projection = dppca.principal_projection(torch.from_numpy(total.reshape(features, features)), dims)
    if training is None:
        return projection, None, shares
    model = build_model("mlp", seed, in_features=dims)
    for step in range(training.rounds):
        round_config = {"algorithm": "dppca-train", "seed": seed, "step": step, "run-key": run_key,
                        "limit-train": limit_train or 0, "noise-multiplier": training.noise_multiplier,
                        "sample-rate": training.sample_rate, "steps": training.steps, "lot-size": training.lot_size,
                        "max-grad-norm": training.max_grad_norm, "lr": training.lr_at(step + 1)}
        _fedavg_round(grid, round_config, model, training.event, shares, {"projection": projection.numpy()})
        if after_round is not None:
            after_round(step + 1, model, projection)
    return projection, model, shares
