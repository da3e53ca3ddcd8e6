"""Abadi et al. 2016's "strong composition" comparison number — **the paper's recipe,
not a sound bound**; fedpriv's ``advanced`` accountant is the sound version.

For q = 0.01, σ = 4, T = 10,000, δ = 1e-5 the paper quotes ε ≈ 9.34. This reproduces
it (9.339): half of δ goes to the steps, δ₀ = δ/(2Tq) per step and δ' = δ/2;
ε₀ = √(2 ln(1.25/δ₀))/σ (classic Gaussian; here ε₀ = 1.46, outside its ε < 1 range);
amplification taken as ε = qε₀ (the paper's "O(qε)"; the valid value is
log(1 + q(e^ε₀ − 1)) = 0.033, not 0.0146); first-order advanced composition
ε_tot = √(2T ln(1/δ'))ε + Tε². The sound ``advanced`` accountant gives ≈ 16.8.
"""

from __future__ import annotations

import math


def strong_composition_epsilon(sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of Abadi et al.'s strong-composition comparison (module docstring)."""
    step_delta = delta / (2.0 * steps * sample_rate)
    eps_step = sample_rate * math.sqrt(2.0 * math.log(1.25 / step_delta)) / sigma
    return math.sqrt(2.0 * steps * math.log(2.0 / delta)) * eps_step + steps * eps_step**2
