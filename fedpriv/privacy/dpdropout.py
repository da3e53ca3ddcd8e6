"""The DP-dropout paper's noise calibration (Ermiş & Cemgil, section 4.3) — **the
paper's analysis, not a guarantee**. fedpriv never trains with, or claims privacy from,
these numbers; ``reproduce()`` shows the sound RDP ε for the same σ next to them.

Setting (MNIST): ν = 0.01, E = 200 epochs, T = E/ν = 20,000, target ε = 0.5, δ = 1e-4;
the paper reports σ = 10.88 (DPD-AC) and σ = 3.23 (DPD-zCDP).

Recipe AC: δ_iter = (δ_tot − δ')/(Tν); ε_iter = √(2 log(1.25/δ_iter))/σ (classic Gaussian,
valid only for ε_iter < 1); ε' = log(1 + ν(e^ε_iter − 1)); ε_tot = √(2T log(1/δ'))ε' +
Tε'(e^ε' − 1) (Dwork & Roth Thm 3.20). Sound as stated, but it needs σ ≈ 74, not 10.88.

Recipe zCDP (eqs. 6–7): solve ε_tot = ρ + 2√(ρ log(1/δ_tot)) for ρ; τ = TΔ²/(2ρ);
ε' = Δ√(2 log(1.25/δ')/τ); de-amplify ε_iter = log(1 + (e^ε' − 1)/ν), δ_iter = δ'/ν;
σ = √(2 log(1.25/δ_iter))/ε_iter. **Not a valid bound**: the ρ-zCDP of the *unsampled*
step is converted to (ε', δ') and then credited with amplification by sampling, mixing
two notions (see shared/papers/README.md and docs/accounting.md).
"""

from __future__ import annotations

import math

from scipy.optimize import brentq

from fedpriv.privacy.accountants import epsilon_of
from fedpriv.privacy.accountants.approx import amplify
from fedpriv.privacy.events import dpsgd_event

SAMPLE_RATE = 0.01
EPOCHS = 200
STEPS = round(EPOCHS / SAMPLE_RATE)
TARGET_EPSILON = 0.5
PAPER_DELTA = 1e-4
PAPER_SIGMAS = {"DPD-AC": 10.88, "DPD-zCDP": 3.23}


def classic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε of the classic Gaussian-mechanism bound σ = √(2 log(1.25/δ))/ε (Dwork & Roth 3.22)."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) / sigma


def paper_ac_epsilon(sigma: float, sample_rate: float, steps: int, delta_total: float, delta_prime: float) -> float:
    """ε_tot of the paper's DPD-AC recipe (module docstring) for noise σ."""
    delta_iter = (delta_total - delta_prime) / (steps * sample_rate)
    eps_iter = classic_gaussian_epsilon(sigma, delta_iter)
    eps_step = amplify(eps_iter, sample_rate)
    return math.sqrt(2.0 * steps * math.log(1.0 / delta_prime)) * eps_step + steps * eps_step * math.expm1(eps_step)


def paper_ac_sigma(
    target_epsilon: float, sample_rate: float, steps: int, delta_total: float, delta_prime: float
) -> float:
    """σ with ``paper_ac_epsilon(σ, …) == target_epsilon``."""
    return brentq(
        lambda s: paper_ac_epsilon(s, sample_rate, steps, delta_total, delta_prime) - target_epsilon, 0.5, 1e6
    )


def paper_zcdp_sigma(
    target_epsilon: float, sample_rate: float, steps: int, delta_total: float, delta_prime: float
) -> float:
    """σ of the paper's DPD-zCDP recipe (eqs. 6–7, module docstring), Δ = 1."""
    log_inv = math.log(1.0 / delta_total)
    rho = (math.sqrt(log_inv + target_epsilon) - math.sqrt(log_inv)) ** 2
    tau = steps / (2.0 * rho)
    eps_step = math.sqrt(2.0 * math.log(1.25 / delta_prime) / tau)
    eps_iter = math.log1p(math.expm1(eps_step) / sample_rate)
    return math.sqrt(2.0 * math.log(1.25 / (delta_prime / sample_rate))) / eps_iter


def reproduce(delta: float = PAPER_DELTA) -> dict[str, float]:
    """The paper's two recipes at δ_tot = ``delta`` (AC: δ' = δ/2; zCDP: δ' = δ) and the
    sound RDP ε of the paper's σ's at δ = ``delta`` and at 1e-5."""
    out = {
        "paper_ac_sigma": paper_ac_sigma(TARGET_EPSILON, SAMPLE_RATE, STEPS, delta, delta / 2),
        "paper_zcdp_sigma": paper_zcdp_sigma(TARGET_EPSILON, SAMPLE_RATE, STEPS, delta, delta),
    }
    for name, sigma in PAPER_SIGMAS.items():
        for d in (delta, 1e-5):
            out[f"rdp_epsilon[{name} sigma={sigma}, delta={d:g}]"] = epsilon_of(
                dpsgd_event(sigma, SAMPLE_RATE, STEPS), d, "rdp"
            )
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(reproduce(), indent=1))
