"""Seed paper 002's classifiers on iris: a small network trained with fedpriv's DP-SGD
engine (5-fold cross-validation, as in the report), and Laplace output perturbation of a
trained network's softmax.

**DP-SGD ANN.** 4 → 16 → 3, features scaled into [−1, 1] with the stated box [0, 8] cm.
Cross-validation trains five models and every record is in four of their training sets,
so ε is the budget of the whole procedure: σ is calibrated (RDP) for the steps of all five
trainings together, and the five events compose to ε.

**Output perturbation.** Any two probability vectors are at most 2 apart in L1 (replace-one
or add/remove alike: the bound is the simplex's diameter), so a softmax answer plus
Laplace(2/ε) noise on each coordinate is ε-DP with respect to the training data — per
answer. The report takes sensitivity 1 (half the noise needed). Every answered query is a
``LaplaceEvent`` in a ledger, and answering stops when the next one would exceed the budget.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedpriv.algorithms.box import clamp
from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.mechanisms import laplace_event, laplace_mechanism, laplace_scale
from fedpriv.privacy import PrivacyLedger, calibrate_noise_multiplier
from fedpriv.privacy.events import DpEvent, LaplaceEvent, SelfComposedEvent

BOX = (0.0, 8.0)
FOLDS = 5
NUM_FEATURES = 4
SENSITIVITY = 2.0
"""L1 diameter of the probability simplex: the most any answer can change."""
ANSWER_BOUNDS = (0.0, 1.0)
"""Every probability, clamped to it before its noise."""


def scale(x: np.ndarray) -> torch.Tensor:
    """Measurements clamped to the stated box (NaN to its middle: ``box.clamp``) and mapped to [−1, 1]."""
    low, high = BOX
    return torch.as_tensor(2 * (clamp(x, low, high) - low) / (high - low) - 1, dtype=torch.float32)


def network(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(), nn.Linear(16, 3))


NUM_PARAMETERS = sum(p.numel() for p in network(0).parameters())


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, noise_multiplier: float, sample_rate: float,
          steps: int, max_grad_norm: float, lr: float, seeds: tuple[int, int] | None,
          expected_lot_size: float | None = None) -> tuple[DpEvent, ...]:
    """DP-SGD steps on ``model``; its events. ``seeds`` (sampling, noise) seed the lots and
    the noise, two generators (a simulation); ``None``: both from the OS CSPRNG."""
    config = DPSGDConfig(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, sample_rate=sample_rate,
                         secure_mode=seeds is None)
    sampling, noise = (None, None) if seeds is None else (torch.Generator().manual_seed(s) for s in seeds)
    report = train_dpsgd(model, scale(x), torch.as_tensor(y, dtype=torch.long), config=config, steps=steps,
                         optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                         sampling_generator=sampling, noise_generator=noise, expected_lot_size=expected_lot_size)
    return report.events


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(scale(x)).argmax(dim=1).numpy() == y).mean())


def cross_validate(x: np.ndarray, y: np.ndarray, epsilon: float, delta: float, seed: int = 0, epochs: int = 60,
                   lot_size: int = 24, max_grad_norm: float = 1.0, lr: float = 0.1
                   ) -> tuple[float, tuple[DpEvent, ...]]:
    """Mean test accuracy of 5-fold cross-validation, and the events of all five trainings
    (ε for the whole procedure at ``delta``)."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    folds = np.array_split(np.random.default_rng(seed).permutation(len(y)), FOLDS)
    train_size = len(y) - max(len(f) for f in folds)
    sample_rate = lot_size / train_size
    steps = int(epochs / sample_rate)
    sigma = calibrate_noise_multiplier(epsilon, delta, sample_rate, steps * FOLDS)
    scores: list[float] = []
    events: list[DpEvent] = []
    for i, test in enumerate(folds):
        rest = np.concatenate([f for j, f in enumerate(folds) if j != i])
        model = network(seed * FOLDS + i)
        spent = train(model, x[rest], y[rest], noise_multiplier=sigma, sample_rate=sample_rate, steps=steps,
                      max_grad_norm=max_grad_norm, lr=lr, seeds=(2 * (seed * FOLDS + i), 2 * (seed * FOLDS + i) + 1))
        scores.append(accuracy(model, x[test], y[test]))
        events.extend(spent)
    return float(np.mean(scores)), tuple(events)


class PerturbedOutputs:
    """A trained model that answers queries with Laplace-noised softmax vectors, each answer
    booked in ``ledger`` under ``client``; a query the budget cannot afford is refused
    (``BudgetExceededError``) before the model is run."""

    def __init__(self, model: nn.Module, epsilon_per_answer: float, ledger: PrivacyLedger, client: str = "0",
                 rng: np.random.Generator | None = None) -> None:
        self.model, self.ledger, self.client, self.rng = model, ledger, client, rng
        self.epsilon_per_answer = epsilon_per_answer
        self.event = answer_event(epsilon_per_answer)
        self.answered = 0

    def answer(self, features: np.ndarray) -> np.ndarray:
        """The noisy probability vector for one record's measurements."""
        self.ledger.record(self.client, f"answer-{self.answered}", (self.event,))  # raises past the budget
        self.answered += 1
        return noisy_answers(self.model, features[None, :], self.epsilon_per_answer, self.rng)[0][0]


def answer_event(epsilon_per_answer: float) -> LaplaceEvent:
    """What one answer costs: at most ε, the lattice's rounding included (``fedpriv.mechanisms``)."""
    return laplace_event(3, sensitivity=SENSITIVITY, scale=_answer_scale(epsilon_per_answer), bounds=ANSWER_BOUNDS)


def _answer_scale(epsilon_per_answer: float) -> float:
    return laplace_scale(3, sensitivity=SENSITIVITY, epsilon=epsilon_per_answer, bounds=ANSWER_BOUNDS)


def noisy_answers(model: nn.Module, queries: np.ndarray, epsilon_per_answer: float,
                  rng: np.random.Generator | None = None) -> tuple[np.ndarray, DpEvent]:
    """Each query's softmax plus Laplace(2/ε) noise, and the event of answering them all
    (one ``answer_event`` per query: answers compose)."""
    with torch.no_grad():
        probabilities = torch.softmax(model(scale(queries)), dim=1).numpy()
    noise_scale = _answer_scale(epsilon_per_answer)
    answers = [laplace_mechanism(p, sensitivity=SENSITIVITY, scale=noise_scale, bounds=ANSWER_BOUNDS, rng=rng).values
               for p in probabilities]
    return np.array(answers), SelfComposedEvent(answer_event(epsilon_per_answer), len(queries))


def train_nonprivate(x: np.ndarray, y: np.ndarray, seed: int = 0, epochs: int = 300) -> nn.Module:
    """The network trained without privacy (output perturbation's model)."""
    model = network(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    features, labels = scale(x), torch.as_tensor(y, dtype=torch.long)
    for _ in range(epochs):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(features), labels).backward()
        optimizer.step()
    return model
