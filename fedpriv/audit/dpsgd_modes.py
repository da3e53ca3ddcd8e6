"""Each privacy mode's training in the one-run audit (``MODES``), with the included canaries
among real examples, and each canary's score from what that mode's adversary sees
(``VIEWS``). Everything happens on the audit's own copies: its data are read (never
written), no node, policy or ledger is involved.

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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedpriv.audit.canaries import (
    CanaryModel,
    Recorder,
    log_likelihood_ratio,
    noise_estimate,
    observation,
    with_canaries,
)
from fedpriv.audit.canary_audit import CanaryAudit, NotAvailableError, Progress
from fedpriv.audit.steps import canary_lattice
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
    distributed_dpsgd_event,
    epsilon_of,
)
from fedpriv.privacy.userlevel import user_round_event
from fedpriv.seeding import derive_seed, generator, round_generators
from fedpriv.training import TrainingPlan, train_round


@dataclass
class Run:
    """What one training gives the scorer: per canary, its score; the σ booked and the one
    the adversary estimated from the sentinels."""

    scores: np.ndarray
    booked_sigma: float
    seen_sigma: float | None = None
    claimed: float | None = None
    """The ε its ledger would book, where it is not DP-SGD's Gaussian event's."""


def coins(setup: CanaryAudit) -> torch.Tensor:
    """The auditor's fair coins, from its own stream (never a training stream)."""
    return torch.rand(setup.canaries, generator=generator(setup.seed, "audit", "coins")) < 0.5


def real_data(setup: CanaryAudit) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset(setup.dataset, setup.data_dir, train=True, limit=setup.train_size)
    return model_inputs(setup.model, data.features, cache_dir=False), data.labels


def _input_canaries(setup: CanaryAudit, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """m noise images in [0, 1] with random labels: examples the model can only memorise."""
    gen = generator(setup.seed, "audit", "input-canaries")
    return torch.rand(setup.canaries, *shape, generator=gen), torch.randint(0, 10, (setup.canaries,), generator=gen)


def canary_model(setup: CanaryAudit, shape: tuple[int, ...]) -> CanaryModel:
    return CanaryModel(build_model(setup.model, setup.seed), shape, setup.canaries, 10, setup.max_grad_norm)


def _centralized(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> Run:
    features, labels = real_data(setup)
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
        return Run(_loss_scores(model, extra_x, extra_y), booked)
    model = canary_model(setup, shape)
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
    return Run(scores.numpy(), booked, sigma)


@torch.no_grad()
def _loss_scores(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """−loss of each input canary on the final model: memorised canaries score high."""
    model.eval()
    return (-F.cross_entropy(model(x), y, reduction="none")).numpy()


def _federated(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> Run:
    clients = setup.clients or 1
    features, labels = real_data(setup)
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
    model = build_model(setup.model, setup.seed) if setup.canary_type == "input" else canary_model(setup, shape)
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
        return Run(_loss_scores(model, input_x, input_y), booked)
    sigma = noise_estimate(torch.cat(sentinels), steps)
    scores = log_likelihood_ratio(counts, steps, setup.sample_rate, sigma).sum(0)
    return Run(scores.numpy(), booked, sigma)


def _plan(setup: CanaryAudit, noise_multiplier: float) -> TrainingPlan:
    """A client's local plan: one epoch of lots at rate ``sample_rate``, plain SGD."""
    return TrainingPlan(model=setup.model, lot_size=1, max_grad_norm=setup.max_grad_norm,
                        noise_multiplier=noise_multiplier, lr=setup.lr, momentum=0.0,
                        max_physical_batch_size=setup.max_physical_batch_size, shared_sample_rate=setup.sample_rate)


def _local(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> Run:
    return _centralized(setup, included, progress) if setup.clients is None else \
        _federated(setup, included, progress)


def _distributed(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> Run:
    if setup.canary_type != "gradient":
        raise NotAvailableError("the distributed audit has gradient canaries only: the server sees sums, not models")
    clients = setup.clients or 1
    features, labels = real_data(setup)
    model = canary_model(setup, tuple(features.shape[1:]))
    lattice, booked, claimed = distributed_claim(setup, model)
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
    return Run(scores.numpy(), booked, sigma, claimed=claimed)


def distributed_claim(setup: CanaryAudit, model: CanaryModel) -> tuple[Lattice, float, float]:
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


def _user(setup: CanaryAudit, included: torch.Tensor, progress: Progress) -> Run:
    """Central user-level DP-FedAvg with canary clients (the module docstring's ``user``)."""
    if setup.canary_type != "gradient":
        raise NotAvailableError("the user-level audit has canary clients only: a client is the unit protected")
    clients, clip, q = setup.clients or 1, setup.max_grad_norm, setup.sample_rate
    features, labels = real_data(setup)
    model = canary_model(setup, tuple(features.shape[1:]))
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
    return Run(scores.numpy(), booked, sigma, claimed=claimed)


MODES: dict[PrivacyMode, Callable[[CanaryAudit, torch.Tensor, Progress], Run]] = {
    PrivacyMode.LOCAL: _local,
    PrivacyMode.DISTRIBUTED: _distributed,
    PrivacyMode.USER: _user,
}
"""Each privacy mode's training and scoring: a mode plugs in here, given the coins."""


VIEWS = {
    PrivacyMode.LOCAL: "every step's noisy gradient (centralized) or each client's model after each round (federated)",
    PrivacyMode.DISTRIBUTED: "each step's decoded noisy sum (the server)",
    PrivacyMode.USER: "each round's released model",
}
