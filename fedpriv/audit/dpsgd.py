"""Audits of DP-SGD training: a one-run canary audit per privacy mode (``MODES``) and, in
local mode, the white-box step audit of the engine (``fedpriv.audit.steps``); ``audit_dpsgd``
runs the ``parts`` asked for and flags the run when any part rejects the claim.

Each one-run audit draws m fair coins (its own generator), trains once with the included
canaries among real examples, scores every canary from what the adversary of that mode
sees, and bounds ε with ``one_run.best_guesses``.  Everything happens on the audit's own
copies: its data are read (never written), no node, policy or ledger is involved.

- ``local`` (centralized, ``clients`` None): the DP-SGD engine (``train_dpsgd``) over
  E epochs as ``simulations.centralized`` trains (generators of client 0, round = epoch);
  the adversary sees every step's noisy gradient.
- ``local`` with K clients: each round every client runs ``train_round`` (the routine a
  node runs) on its share and its canaries; the adversary is the server, which sees each
  client's returned model; the models are averaged (FedAvg, post-processing).

- ``distributed`` with K clients (1 when ``clients`` is None): each round is one step on
  the union, every client's share computed by ``distributed_contribution`` (the routine a
  node runs: lattice, rounding, discrete Gaussian share for K honest shares), summed mod
  2^bits and decoded as the server does; the adversary is the server, which sees each
  round's decoded noisy sum. σ is calibrated for the distributed event, so the claim is
  the ε a node's ledger books (the sound bound, ``docs/accounting.md``).

- ``user`` (central user-level DP-FedAvg, ``server.userlevel``) with K real clients (1 when
  ``clients`` is None) and m **canary clients**, canary j in the population iff its coin says
  so. Round r (``steps`` rounds: an epoch is 1/q rounds): each client of the population is
  Poisson-sampled at q = ``sample_rate`` with the server's own draws (``RoundNoise``); a sampled
  real client trains its share with the plain local plan and clips its delta to S =
  ``max_grad_norm`` (``userlevel_steps.clipped_delta``, what a node sends); canary j's delta
  is S·e_j on its own canary weight (``CanaryModel``'s, which no real client moves); the
  server's ``noisy_step`` adds N(0, (zS)²) to every coordinate of the sum and divides by the expected cohort
  W = q·(K + m/2) (the server's q·|P|, with |P| the population's public expected size, so that
  only the canaries depend on the coins). The adversary sees each round's released model.
  The claim is ``user_round_event(q, z)`` over the rounds, z calibrated as the server does.

``unsafe_noise_multiplier`` trains with that σ while the claim (and the scores) keep the
calibrated one: the negative control, which the audit must flag; ``bug`` (``fedpriv.audit.bugs``,
local mode) runs the engine with a noise or clipping bug, in both parts.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedpriv.audit.bugs import NO_BUG, EngineBug
from fedpriv.audit.canaries import (
    CanaryModel,
    Recorder,
    log_likelihood_ratio,
    noise_estimate,
    observation,
    with_canaries,
)
from fedpriv.audit.one_run import DEFAULT_CONFIDENCE, best_guesses
from fedpriv.audit.steps import DEFAULT_ALPHA, StepAudit, audit_steps, canary_lattice
from fedpriv.data import load_dataset
from fedpriv.distributed.contribution import decode_sum, distributed_contribution, unflatten
from fedpriv.distributed.lattice import Lattice
from fedpriv.dpsgd import DPSGDConfig, steps_per_epoch, train_dpsgd
from fedpriv.federation.settings import PrivacyMode, ServerRandomness
from fedpriv.federation.userlevel_steps import RoundNoise, clipped_delta, noisy_step, sent_delta
from fedpriv.models import build_model, model_inputs
from fedpriv.privacy import (
    SelfComposedEvent,
    calibrate_distributed_noise,
    calibrate_noise_multiplier,
    distributed_dpsgd_event,
    dpsgd_event,
    epsilon_of,
)
from fedpriv.privacy.userlevel import user_round_event
from fedpriv.seeding import derive_seed, generator, round_generators
from fedpriv.training import TrainingPlan, train_round

PARTS = frozenset({"one-run", "white-box"})
"""The audit's parts: the one-run canary audit, the white-box step audit (``steps``)."""

Progress = Callable[[str], None]
"""Where long work reports how far it got (the command: a line on stderr)."""


class NotAvailableError(ValueError):
    """An audit fedpriv does not have: a canary type its mode's adversary cannot score."""


@dataclass(frozen=True)
class CanaryAudit:
    """One audit's settings.  ``clients`` None: centralized; else K federated clients.
    ``canary_type``: "gradient" (white box, ``CanaryModel``) or "input" (mislabelled noise
    images, scored by their loss on the final model: black box, weak)."""

    canaries: int = 1000
    target_epsilon: float = 2.0
    delta: float = 1e-5
    clients: int | None = None
    model: str = "cnn"
    dataset: str = "mnist"
    train_size: int = 1000
    sample_rate: float = 0.1
    epochs: int = 5
    max_grad_norm: float = 1.0
    lr: float = 0.05
    max_physical_batch_size: int = 256
    seed: int = 0
    data_dir: str | None = None
    unsafe_noise_multiplier: float | None = None
    canary_type: str = "gradient"
    confidence: float = DEFAULT_CONFIDENCE
    parts: frozenset[str] = PARTS
    step_canaries: int = 64
    step_alpha: float = DEFAULT_ALPHA
    bug: EngineBug = NO_BUG

    def __post_init__(self) -> None:
        if self.canaries < 2:
            raise ValueError(f"canaries must be >= 2, got {self.canaries}")
        if self.clients is not None and self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if not self.parts or not self.parts <= PARTS:
            raise ValueError(f"parts must be a non-empty subset of {sorted(PARTS)}, got {sorted(self.parts)}")
        if self.canary_type not in ("gradient", "input"):
            raise ValueError(f"canary_type must be 'gradient' or 'input', got {self.canary_type!r}")
        if self.unsafe_noise_multiplier is not None and self.unsafe_noise_multiplier < 0:
            raise ValueError(f"unsafe_noise_multiplier must be >= 0, got {self.unsafe_noise_multiplier}")

    @property
    def steps(self) -> int:
        """Steps each party takes in all: E epochs (rounds of one local epoch) at q."""
        return self.epochs * steps_per_epoch(self.sample_rate)

    def noise_multiplier(self) -> float:
        """The calibrated σ: the one the accountant books."""
        return calibrate_noise_multiplier(self.target_epsilon, self.delta, self.sample_rate, self.steps)

    def trained_noise_multiplier(self, booked: float) -> float:
        return booked if self.unsafe_noise_multiplier is None else self.unsafe_noise_multiplier

    def step_audit(self, booked: float, batch: int, clients: int | None) -> StepAudit:
        """The white-box step audit of this run's claim (σ booked, C; ``clients`` None: the
        engine's step, else distributed mode's), with its negative controls:
        ``unsafe_noise_multiplier`` as a noise scale, and ``bug``."""
        trained = self.trained_noise_multiplier(booked) / booked
        bug = EngineBug(self.bug.noise_scale * trained, self.bug.clip_scale)
        return StepAudit(noise_multiplier=booked, max_grad_norm=self.max_grad_norm, canaries=self.step_canaries,
                         batch=batch, alpha=self.step_alpha, seed=self.seed, model=self.model, lr=self.lr,
                         max_physical_batch_size=self.max_physical_batch_size, bug=bug, clients=clients)


@dataclass
class _Run:
    """What one training gives the scorer: per canary, its score; the σ booked and the one
    the adversary estimated from the sentinels."""

    scores: np.ndarray
    booked_sigma: float
    seen_sigma: float | None = None
    claimed: float | None = None
    """The ε its ledger would book, where it is not DP-SGD's Gaussian event's."""


def _coins(setup: CanaryAudit) -> torch.Tensor:
    """The auditor's fair coins, from its own stream (never a training stream)."""
    return torch.rand(setup.canaries, generator=generator(setup.seed, "audit", "coins")) < 0.5


def _real_data(setup: CanaryAudit) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset(setup.dataset, setup.data_dir, train=True, limit=setup.train_size)
    return model_inputs(setup.model, data.features, cache_dir=False), data.labels


def _input_canaries(setup: CanaryAudit, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """m noise images in [0, 1] with random labels: examples the model can only memorise."""
    gen = generator(setup.seed, "audit", "input-canaries")
    return torch.rand(setup.canaries, *shape, generator=gen), torch.randint(0, 10, (setup.canaries,), generator=gen)


def _canary_model(setup: CanaryAudit, shape: tuple[int, ...]) -> CanaryModel:
    return CanaryModel(build_model(setup.model, setup.seed), shape, setup.canaries, 10, setup.max_grad_norm)


def _centralized(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> _Run:
    features, labels = _real_data(setup)
    booked = setup.noise_multiplier()
    config = setup.bug.config(DPSGDConfig(
        noise_multiplier=setup.trained_noise_multiplier(booked), max_grad_norm=setup.max_grad_norm,
        sample_rate=setup.sample_rate, max_physical_batch_size=setup.max_physical_batch_size))
    shape = tuple(features.shape[1:])
    # a public divisor, the same whatever the coins: q·(N + m/2)
    divisor = setup.sample_rate * (len(labels) + setup.canaries / 2)
    if setup.canary_type == "input":
        extra_x, extra_y = _input_canaries(setup, shape)
        chosen = torch.nonzero(included).squeeze(1)
        model = build_model(setup.model, setup.seed)
        x, y = torch.cat([features, extra_x[chosen]]), torch.cat([labels, extra_y[chosen]])
        for epoch in range(1, setup.epochs + 1):
            sampling, noise = round_generators(setup.seed, 0, epoch)
            train_dpsgd(model, x, y, config=config, steps=steps_per_epoch(setup.sample_rate),
                        optimizer=torch.optim.SGD(model.parameters(), lr=setup.lr), sampling_generator=sampling,
                        noise_generator=noise, expected_lot_size=divisor)
            progress(f"one-run audit: epoch {epoch}/{setup.epochs}")
        return _Run(_loss_scores(model, extra_x, extra_y), booked)
    model = _canary_model(setup, shape)
    x, y, _ = with_canaries(features, labels, included)
    seen: list[torch.Tensor] = []
    for epoch in range(1, setup.epochs + 1):
        sampling, noise = round_generators(setup.seed, 0, epoch)
        recorder = Recorder(model, setup.lr)
        train_dpsgd(model, x, y, config=config, steps=steps_per_epoch(setup.sample_rate), optimizer=recorder,
                    sampling_generator=sampling, noise_generator=noise, expected_lot_size=divisor)
        seen.extend(recorder.seen)
        progress(f"one-run audit: epoch {epoch}/{setup.epochs}")
    counts = observation(torch.stack(seen), divisor, setup.max_grad_norm)  # (steps, m + sentinels)
    sigma = noise_estimate(counts[:, setup.canaries:], 1)
    scores = log_likelihood_ratio(counts[:, :setup.canaries], 1, setup.sample_rate, sigma).sum(0)
    return _Run(scores.numpy(), booked, sigma)


@torch.no_grad()
def _loss_scores(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """−loss of each input canary on the final model: memorised canaries score high."""
    model.eval()
    return (-F.cross_entropy(model(x), y, reduction="none")).numpy()


def _federated(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> _Run:
    clients = setup.clients or 1
    features, labels = _real_data(setup)
    booked = setup.noise_multiplier()
    shape = tuple(features.shape[1:])
    plan = setup.bug.plan(_plan(setup, setup.trained_noise_multiplier(booked)))
    owner = torch.arange(setup.canaries) % clients  # canary j is a record of client j mod K
    shares = []
    input_x, input_y = _input_canaries(setup, shape)
    for k in range(clients):
        real = slice(k, None, clients)
        mine = included & (owner == k)
        public_n = len(labels[real]) + int((owner == k).sum()) // 2  # q·ñ divides: independent of the coins
        if setup.canary_type == "input":
            chosen = torch.nonzero(mine).squeeze(1)
            x, y = torch.cat([features[real], input_x[chosen]]), torch.cat([labels[real], input_y[chosen]])
        else:
            x, y, _ = with_canaries(features[real], labels[real], mine)
        shares.append((x, y, public_n))
    model = build_model(setup.model, setup.seed) if setup.canary_type == "input" else _canary_model(setup, shape)
    counts, sentinels = torch.zeros(setup.epochs, setup.canaries), []
    steps = plan.steps_per_round(1)
    for round_ in range(1, setup.epochs + 1):
        before = copy.deepcopy(model.state_dict())
        returned = []
        for k, (x, y, public_n) in enumerate(shares):
            local = copy.deepcopy(model)
            train_round(local, x, y, plan, seed=setup.seed, client=k, round_=round_, device="cpu",
                        num_examples=public_n)
            returned.append(local.state_dict())
            if isinstance(local, CanaryModel):  # what the server receives: client k's canaries moved
                moved = local.canary.weight.detach()[0] - before["canary.weight"][0]  # −lr · Σ_t gradient_t
                gradients = -moved / plan.lr_at(round_)
                seen = observation(gradients, setup.sample_rate * public_n, setup.max_grad_norm)
                counts[round_ - 1, owner == k] = seen[:setup.canaries][owner == k]
                sentinels.append(seen[setup.canaries:])
        model.load_state_dict({name: torch.stack([s[name] for s in returned]).mean(0) for name in before})
        progress(f"one-run audit: round {round_}/{setup.epochs}")
    if setup.canary_type == "input":
        return _Run(_loss_scores(model, input_x, input_y), booked)
    sigma = noise_estimate(torch.cat(sentinels), steps)
    scores = log_likelihood_ratio(counts, steps, setup.sample_rate, sigma).sum(0)
    return _Run(scores.numpy(), booked, sigma)


def _plan(setup: CanaryAudit, noise_multiplier: float) -> TrainingPlan:
    """A client's local plan: one epoch of lots at rate ``sample_rate``, plain SGD."""
    return TrainingPlan(model=setup.model, lot_size=1, max_grad_norm=setup.max_grad_norm,
                        noise_multiplier=noise_multiplier, lr=setup.lr, momentum=0.0,
                        max_physical_batch_size=setup.max_physical_batch_size, shared_sample_rate=setup.sample_rate)


def _local(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> _Run:
    return _centralized(setup, included, progress) if setup.clients is None else \
        _federated(setup, included, progress)


def _distributed(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> _Run:
    if setup.canary_type != "gradient":
        raise NotAvailableError("the distributed audit has gradient canaries only: the server sees sums, not models")
    clients = setup.clients or 1
    features, labels = _real_data(setup)
    model = _canary_model(setup, tuple(features.shape[1:]))
    lattice, booked, claimed = _distributed_claim(setup, model)
    dimension = lattice.dimension
    trained = setup.trained_noise_multiplier(booked)
    owner = torch.arange(setup.canaries) % clients
    shares = [with_canaries(features[k::clients], labels[k::clients], included & (owner == k))[:2]
              for k in range(clients)]
    divisor = setup.sample_rate * (len(labels) + setup.canaries / 2)  # public: the same whatever the coins
    seen = []
    for step in range(1, setup.steps + 1):
        total = np.zeros(dimension, dtype=np.uint64)
        for k, (x, y) in enumerate(shares):
            contribution = distributed_contribution(
                model, x, y, sample_rate=setup.sample_rate, lattice=lattice, noise_multiplier=trained,
                honest_shares=clients, secure=False, max_physical_batch_size=setup.max_physical_batch_size,
                sampling_generator=generator(setup.seed, "audit", "sampling", k, step),
                rounding_generator=generator(setup.seed, "audit", "rounding", k, step),
                noise_generator=np.random.default_rng(derive_seed(setup.seed, "audit", "noise", k, step)))
            total = (total + contribution.vector) % np.uint64(lattice.modulus)
        gradient = decode_sum(total, lattice) / divisor  # what the server sees, and steps with
        grads = unflatten(gradient, model)
        seen.append(grads["canary.weight"][0].float().clone())
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.sub_(setup.lr * grads[name])
        progress(f"one-run audit: step {step}/{setup.steps}")
    counts = observation(torch.stack(seen), divisor, setup.max_grad_norm)
    sigma = noise_estimate(counts[:, setup.canaries:], 1)
    scores = log_likelihood_ratio(counts[:, :setup.canaries], 1, setup.sample_rate, sigma).sum(0)
    return _Run(scores.numpy(), booked, sigma, claimed=claimed)


def _distributed_claim(setup: CanaryAudit, model: CanaryModel) -> tuple[Lattice, float, float]:
    """The one-run model's lattice, the σ whose K shares a node books at ``target_epsilon``
    (the share calibrated, as a σ), and the ε that node's ledger books for the run."""
    clients = setup.clients or 1
    lattice = canary_lattice(setup.max_grad_norm, sum(p.numel() for p in model.parameters()))
    share = calibrate_distributed_noise(setup.target_epsilon, setup.delta, setup.sample_rate, setup.steps, clients,
                                        lattice.sensitivity, lattice.dimension)
    booked = share * math.sqrt(clients) / lattice.clip
    event = distributed_dpsgd_event(lattice.noise_stddev(booked, clients), clients, lattice.sensitivity,
                                    lattice.dimension, setup.sample_rate, setup.steps)
    return lattice, booked, epsilon_of(event, setup.delta)


def _user(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> _Run:
    """Central user-level DP-FedAvg with canary clients (the module docstring's ``user``)."""
    if setup.canary_type != "gradient":
        raise NotAvailableError("the user-level audit has canary clients only: a client is the unit protected")
    clients, clip, q = setup.clients or 1, setup.max_grad_norm, setup.sample_rate
    features, labels = _real_data(setup)
    model = _canary_model(setup, tuple(features.shape[1:]))
    booked = setup.noise_multiplier()  # z for q and the rounds, as ``UserLevelFedAvg`` calibrates it
    std = setup.trained_noise_multiplier(booked) * clip
    plan = _plan(setup, 0.0).non_private()
    cohort = q * (clients + setup.canaries / 2)  # W: public, the same whatever the coins
    canaries = torch.nonzero(included).squeeze(1).tolist()  # the canary clients of the population
    seen = []
    for round_ in range(1, setup.steps + 1):
        noise = RoundNoise(ServerRandomness.SEEDED, setup.seed, round_)
        sampled = noise.uniform(clients + len(canaries)) < q  # real clients first, then the canaries
        before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        deltas = []
        for k in np.flatnonzero(sampled[:clients]):
            local = copy.deepcopy(model)
            train_round(local.base, features[k::clients], labels[k::clients], plan, seed=setup.seed, client=int(k),
                        round_=round_, device="cpu")
            deltas.append(sent_delta(clipped_delta(before, local.state_dict(), clip)[0], before))  # a node's
        canary_delta = {name: np.zeros(tensor.shape) for name, tensor in before.items()}
        canary_delta["canary.weight"][0, np.asarray(canaries, dtype=np.int64)[sampled[clients:]]] = clip
        released = noisy_step({name: tensor.numpy() for name, tensor in before.items()}, [*deltas, canary_delta],
                              noise, std, cohort)  # the server's step
        model.load_state_dict({name: torch.from_numpy(value) for name, value in released.items()})
        seen.append(model.canary_weights() - before["canary.weight"][0])
        progress(f"one-run audit: round {round_}/{setup.steps}")
    counts = observation(-torch.stack(seen), cohort, clip)  # the model moves by +S/W per canary drawn
    sigma = noise_estimate(counts[:, setup.canaries:], 1)
    scores = log_likelihood_ratio(counts[:, :setup.canaries], 1, q, sigma).sum(0)
    claimed = epsilon_of(SelfComposedEvent(user_round_event(q, booked), setup.steps), setup.delta)
    return _Run(scores.numpy(), booked, sigma, claimed=claimed)


MODES: dict[PrivacyMode, Callable[[CanaryAudit, torch.Tensor, Progress], _Run]] = {
    PrivacyMode.LOCAL: _local,
    PrivacyMode.DISTRIBUTED: _distributed,
    PrivacyMode.USER: _user,
}
"""Each privacy mode's training and scoring: a mode plugs in here, given the coins."""


def mode_label(mode: PrivacyMode, clients: int | None) -> dict[str, Any]:
    """How the result names the run: "centralized" (local mode, no clients), else the privacy
    mode and its K clients."""
    if mode is PrivacyMode.LOCAL and clients is None:
        return {"mode": "centralized"}
    return {"mode": mode.value, "clients": clients or 1}


def _quiet(message: str) -> None:
    """No progress report."""


def audit_dpsgd(setup: CanaryAudit, mode: PrivacyMode | str = PrivacyMode.LOCAL,
                progress: Progress = _quiet) -> dict[str, Any]:
    """Run the audit's parts (one-run; white-box step audit of the engine in local mode where
    ``setup.white_box``); the result as the command writes it (see ``simulations.audit``).
    ``flagged``: some part rejects the claim at its stated confidence."""
    mode = PrivacyMode(mode)
    if setup.bug.active and mode is not PrivacyMode.LOCAL:
        raise NotAvailableError(f"the injected engine bugs wrap fedpriv.dpsgd's engine: local mode only, not {mode}")
    start = time.perf_counter()
    parts: dict[str, Any] = {}
    if "one-run" in setup.parts:
        parts["one_run"], booked, claimed = _one_run(setup, mode, progress)
    else:  # the claim without the run
        booked, claimed = _claim(setup, mode)
    if "white-box" not in setup.parts:
        parts["white_box"] = {"skipped": "not asked for"}
    elif mode is PrivacyMode.USER:
        parts["white_box"] = {"skipped": "the step audit drives a node's DP-SGD step (the engine's, or distributed "
                                         "mode's contribution); user level's nodes send un-noised deltas"}
    else:
        features, labels = _real_data(setup)
        batch = max(1, round(setup.sample_rate * len(labels)))
        clients = None if mode is PrivacyMode.LOCAL else setup.clients or 1
        parts["white_box"] = audit_steps(setup.step_audit(booked, batch, clients), features, labels,
                                         setup.sample_rate, setup.steps, setup.delta, progress)
    return {
        "flagged": any(part.get("flagged", False) for part in parts.values()),
        **mode_label(mode, setup.clients),
        "claimed_epsilon": claimed,
        "delta": setup.delta,
        "noise_multiplier": booked,
        "max_grad_norm": setup.max_grad_norm,
        "sample_rate": setup.sample_rate,
        "steps": setup.steps,
        **parts,
        "unsafe_noise_multiplier": setup.unsafe_noise_multiplier,
        "injected_bug": {"noise_scale": setup.bug.noise_scale, "clip_scale": setup.bug.clip_scale}
        if setup.bug.active else None,
        "seed": setup.seed,
        "model": setup.model,
        "train_size": setup.train_size,
        "seconds": round(time.perf_counter() - start, 2),
    }


def _claim(setup: CanaryAudit, mode: PrivacyMode) -> tuple[float, float]:
    """(σ booked, claimed ε) without training: what the one-run part's training would book."""
    if mode is PrivacyMode.DISTRIBUTED:
        _, booked, claimed = _distributed_claim(setup, _canary_model(setup, _real_data(setup)[0].shape[1:]))
        return booked, claimed
    if mode is not PrivacyMode.LOCAL:
        raise NotAvailableError(f"the white-box step audit runs alone in local or distributed mode, not {mode}")
    booked = setup.noise_multiplier()
    return booked, epsilon_of(dpsgd_event(booked, setup.sample_rate, setup.steps), setup.delta)


def _one_run(setup: CanaryAudit, mode: PrivacyMode, progress: Progress) -> tuple[dict[str, Any], float, float]:
    """The one-run part: its result, the σ booked and the claimed ε."""
    included = _coins(setup)
    run = MODES[mode](setup, included, progress)
    bound = best_guesses(run.scores, included.numpy(), setup.delta, setup.confidence)
    claimed = run.claimed if run.claimed is not None else \
        epsilon_of(dpsgd_event(run.booked_sigma, setup.sample_rate, setup.steps), setup.delta)
    one_run = {
        "flagged": bound.epsilon_lower_bound > claimed,
        "epsilon_lower_bound": bound.epsilon_lower_bound,
        "confidence": bound.confidence,
        "method": "one-run (Steinke, Nasr & Jagielski 2023), "
                  + ("white-box Dirac gradient canaries, likelihood-ratio scores"
                     if setup.canary_type == "gradient" else "input-space canaries, loss scores on the final model"),
        "assumptions": "each canary is in by a fair coin; the adversary sees " + _VIEWS[mode]
                       + "; a bound below the claim proves nothing (docs/audit.md)",
        "canaries": bound.canaries,
        "included": int(included.sum()),
        "guesses": bound.guesses,
        "correct": bound.correct,
        "k_in": bound.k_in,
        "k_out": bound.k_out,
        "pairs_tried": bound.pairs_tried,
        "estimated_noise_multiplier": run.seen_sigma,
        "scores": {"in": run.scores[included.numpy()].tolist(), "out": run.scores[~included.numpy()].tolist()},
    }
    return one_run, run.booked_sigma, claimed


_VIEWS = {
    PrivacyMode.LOCAL: "every step's noisy gradient (centralized) or each client's model after each round (federated)",
    PrivacyMode.DISTRIBUTED: "each step's decoded noisy sum (the server)",
    PrivacyMode.USER: "each round's released model",
}
