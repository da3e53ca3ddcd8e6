"""Audits of DP-SGD training: a one-run canary audit per privacy mode (``MODES``) and, in
local mode, the white-box step audit of the engine (``fedpriv.audit.steps``); ``audit_dpsgd``
runs the ``parts`` asked for and flags the run when any part rejects the claim.

Each one-run audit draws m fair coins (its own generator), trains once with the included
canaries among real examples, scores every canary from what the adversary of that mode
sees, and bounds ε with ``one_run.best_guesses``.  Everything happens on the audit's own
copies: its data are read (never written), no node, policy or ledger is involved.

The settings are ``fedpriv.audit.canary_audit``'s, each mode's training and scores
``fedpriv.audit.dpsgd_modes``'.
"""

from __future__ import annotations

import time
from typing import Any

from fedpriv.audit.canary_audit import CanaryAudit, NotAvailableError, Progress
from fedpriv.audit.dpsgd_modes import MODES, VIEWS, canary_model, coins, distributed_claim, real_data
from fedpriv.audit.one_run import best_guesses
from fedpriv.audit.steps import audit_steps
from fedpriv.federation.settings import PrivacyMode
from fedpriv.privacy import dpsgd_event, epsilon_of


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
        features, labels = real_data(setup)
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
        _, booked, claimed = distributed_claim(setup, canary_model(setup, real_data(setup)[0].shape[1:]))
        return booked, claimed
    if mode is not PrivacyMode.LOCAL:
        raise NotAvailableError(f"the white-box step audit runs alone in local or distributed mode, not {mode}")
    booked = setup.noise_multiplier()
    return booked, epsilon_of(dpsgd_event(booked, setup.sample_rate, setup.steps), setup.delta)


def _one_run(setup: CanaryAudit, mode: PrivacyMode, progress: Progress) -> tuple[dict[str, Any], float, float]:
    """The one-run part: its result, the σ booked and the claimed ε."""
    included = coins(setup)
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
        "assumptions": "each canary is in by a fair coin; the adversary sees " + VIEWS[mode]
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
