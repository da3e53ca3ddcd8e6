"""Precision-based attacks (Haney et al. 2022): noise of a scale below the spacing of the
outputs rounds away, and the "noisy" value is the input itself (at |x| ≥ 2⁵³·scale, or
below the 2^k lattice). The Laplace primitive refuses such a scale before drawing any noise,
judged on the stated bounds (a data-independent refusal), and so do the algorithms' costs."""

import math

import numpy as np
import pytest

from clients.classic.client_app import app
from fedpriv.algorithms import iris, kmeans, linreg
from fedpriv.algorithms.box import Box
from fedpriv.mechanisms import LATTICE_EXPONENT, laplace_event, laplace_mechanism, laplace_scale
from fedpriv.privacy.events import LaplaceEvent
from server.classic.loops import Shares, _ask
from tests.flower.inprocess import InProcessGrid, booked, node_config

HUGE = 2.0**60  # floats near it are 2⁸ apart: noise of scale 1 cannot show
GRAIN = math.ldexp(1.0, LATTICE_EXPONENT)


def _refused(values, scale, bounds, monkeypatch):
    """laplace_mechanism raises, and neither the seeded nor the secure sampler was touched."""
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    monkeypatch.setattr("fedpriv.mechanisms.laplace._measurement", lambda *a: pytest.fail("noise was drawn"))
    for generator in (rng, None):
        with pytest.raises(ValueError, match="precision"):
            laplace_mechanism(values, sensitivity=1.0, scale=scale, bounds=bounds, rng=generator)
    assert rng.bit_generator.state == before


def test_noise_below_the_spacing_of_doubles_at_a_bound_is_refused_before_any_draw(monkeypatch):
    _refused([HUGE], 1.0, (-2 * HUGE, 2 * HUGE), monkeypatch)
    # the reference: numpy's spacing of doubles at the bound; a scale just under it is refused
    bound = 2.0**40
    _refused([0.0], np.spacing(bound) * 0.99, (0.0, bound), monkeypatch)


def test_the_refusal_depends_on_the_bounds_not_on_the_values(monkeypatch):
    # a small value inside wide bounds is refused as a huge one would be: no data-dependent bit
    _refused([0.0], 1.0, (-2 * HUGE, 2 * HUGE), monkeypatch)


def test_noise_below_the_lattice_is_refused(monkeypatch):
    _refused([0.5], GRAIN / 2, (0.0, 1.0), monkeypatch)


@pytest.mark.parametrize("mode", [None, 0])
def test_a_scale_at_the_outputs_spacing_is_accepted_and_noisy(mode):
    bound = 2.0**40
    scale = float(np.spacing(bound))
    rng = None if mode is None else np.random.default_rng(mode)
    out = laplace_mechanism(np.full(200, bound), sensitivity=1.0, scale=scale, bounds=(0.0, bound), rng=rng).values
    assert len(np.unique(out)) > 1  # the noise shows


def test_the_algorithms_costs_refuse_what_their_release_would(monkeypatch):
    with pytest.raises(ValueError, match="precision"):
        linreg.release_event(3, 1e9)
    with pytest.raises(ValueError, match="precision"):
        kmeans.release_event(3, Box(np.zeros(2), np.ones(2)), 1e9)
    with pytest.raises(ValueError, match="precision"):
        kmeans.moments_event(Box(np.zeros(2), np.ones(2)), 1e9)
    with pytest.raises(ValueError, match="precision"):
        iris.answer_event(1e10)
    scale = laplace_scale(3, sensitivity=2.0, epsilon=1.0, bounds=iris.ANSWER_BOUNDS)  # 2/ε, the rounding inside
    assert laplace_event(3, sensitivity=2.0, scale=scale, bounds=iris.ANSWER_BOUNDS) == iris.answer_event(1.0)


@pytest.mark.usefixtures("task_identity")
def test_a_node_refuses_a_linreg_request_whose_noise_would_round_away_before_booking(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr("clients.classic.algorithms.load", lambda *args: read.append(args))
    nodes = {i: node_config(i, 2, tmp_path, **{"epsilon-budget": 1e12, "randomness": "seeded", "seed": 1})
             for i in range(2)}
    config = {"algorithm": "linreg", "dataset": "diabetes", "seed": 0, "epsilon": 1e9, "step": 0,
              "run-key": "run-" + "ab" * 6, "quadratic-share": 0.5}
    arrays = {"low": np.full(2, -1.0), "high": np.full(2, 1.0), "target": np.array([0.0, 1.0])}
    shares = Shares()
    _, accepted = _ask(InProcessGrid({}, nodes, client_app=app), config, arrays, 1, LaplaceEvent(1.0), shares)
    assert accepted == 0 and len(shares.refused) == 2 and read == []
    assert not any(booked(tmp_path / f"node{i}") for i in range(2))
