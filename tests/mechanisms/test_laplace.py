"""The floating-point-safe Laplace mechanism: its outputs, its noise and its cost, each
checked against an independent reference (a lattice, scipy's Laplace, a closed form)."""

import math

import numpy as np
import pytest
from scipy import stats

from fedpriv.mechanisms import LATTICE_EXPONENT, laplace_mechanism
from fedpriv.privacy import make_accountant

GRAIN = math.ldexp(1.0, LATTICE_EXPONENT)
MODES = {"secure": lambda seed: None, "seeded": lambda seed: np.random.default_rng(seed)}


def _draws(value: float, n: int, mode: str, scale: float = 1.0, bounds=(-10.0, 10.0)) -> np.ndarray:
    release = laplace_mechanism(np.full(n, value), sensitivity=1.0, scale=scale, bounds=bounds,
                                rng=MODES[mode](7))
    return release.values


@pytest.mark.parametrize("mode", MODES)
def test_outputs_for_neighbouring_inputs_lie_on_one_lattice(mode):
    # Mironov's attack reads the input off the low bits of textbook Laplace outputs: here
    # every output for inputs 0, 1 and an input off the lattice is a multiple of 2^k
    for value in (0.0, 1.0, 0.1 + 1e-12):
        out = _draws(value, 2000, mode)
        assert np.array_equal(out / GRAIN, np.round(out / GRAIN))
        assert len(np.unique(out)) > 1900  # noise, not a constant


SCALES = (0.5, 3.0)
FAMILY_ALPHA = 1e-6
"""The family-wise false-failure rate of the unseeded (secure) KS tests below, Bonferroni over
the scales; seeded draws are fixed, so their tests cannot flake."""
ALPHA = FAMILY_ALPHA / len(SCALES)
DRAWS = 30_000
"""Enough for power at ``ALPHA``: Laplace(s) and Laplace(1.2 s) differ by D = 0.0335 in KS
distance (at x = 6 ln(1.2) s), and DKW puts the empirical D within 0.0176 of it but for
2·exp(-2·DRAWS·0.0176²) < 2e-8, above the 0.0159 that ``ALPHA`` needs. At 4,000 draws and
α = 1e-3 per test, the power check failed about 1 run in 100."""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", SCALES)
def test_noise_is_laplace_of_the_stated_scale(mode, scale):
    noise = _draws(2.0, DRAWS, mode, scale=scale) - 2.0
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > ALPHA
    assert stats.kstest(noise, stats.laplace(scale=1.2 * scale).cdf).pvalue < ALPHA  # the test can tell


def test_values_outside_the_stated_bounds_are_clamped_first():
    out = _draws(1e6, 4000, "seeded", scale=0.5, bounds=(0.0, 1.0))
    assert abs(np.median(out) - 1.0) < 0.05


def test_cost_is_sensitivity_over_scale_plus_the_lattice_rounding():
    # closed form: rounding each of n values to the lattice moves the L1 sum by ≤ n·2^k
    for size, sensitivity, scale in ((1, 1.0, 1.0), (10, 2.0, 0.5), (64, 4.0, 8.0)):
        release = laplace_mechanism(np.zeros(size), sensitivity=sensitivity, scale=scale, bounds=(-1.0, 1.0))
        expected = (sensitivity + size * GRAIN) / scale
        assert 1.0 / release.event.noise_multiplier == pytest.approx(expected, rel=1e-12)
        assert make_accountant("basic").compose(release.event).epsilon(1e-5) == pytest.approx(expected, rel=1e-9)


def test_seeded_is_reproducible_and_secure_is_not():
    def release(rng):
        return laplace_mechanism([0.5, 0.25], sensitivity=1.0, scale=1.0, bounds=(0.0, 1.0), rng=rng).values

    assert np.array_equal(release(np.random.default_rng(3)), release(np.random.default_rng(3)))
    assert not np.array_equal(release(None), release(None))


@pytest.mark.parametrize("kwargs, message", [
    ({"values": [0.0, math.nan]}, "finite"),
    ({"values": [math.inf]}, "finite"),
    ({"scale": 0.0}, "scale"),
    ({"sensitivity": -1.0}, "sensitivity"),
    ({"bounds": (1.0, 0.0)}, "bounds"),
    ({"bounds": (0.0, math.inf)}, "bounds"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    arguments = {"values": [0.0], "sensitivity": 1.0, "scale": 1.0, "bounds": (0.0, 1.0), **kwargs}
    with pytest.raises(ValueError, match=message):
        laplace_mechanism(arguments.pop("values"), **arguments)
