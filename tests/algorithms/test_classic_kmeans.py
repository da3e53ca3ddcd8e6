"""DPLloyd and input-perturbation k-means: sensitivity (Hypothesis, add/remove one record,
records outside the bounds included), noise scale (KS), cost (closed form), empty and
negative noisy counts, utility at a large ε, clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats
from sklearn.datasets import load_iris

from fedpriv.algorithms.kmeans import (
    Box,
    assign,
    cluster_sums,
    clustering_accuracy,
    dplloyd,
    initial_centroids,
    moments,
    moments_sensitivity,
    noisy_moments,
    noisy_sums,
    perturb_inputs,
    sums_sensitivity,
    update,
)
from fedpriv.privacy import make_accountant

BOX = Box(np.array([0.0, -1.0]), np.array([4.0, 1.0]))
CENTROIDS = np.array([[1.0, 0.0], [3.0, 0.5], [2.0, -0.5]])
coordinates = st.floats(-10.0, 10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(data=arrays(float, (5, 2), elements=coordinates), extra=arrays(float, 2, elements=coordinates))
def test_adding_one_record_moves_the_sums_by_at_most_the_sensitivity(data, extra):
    before = cluster_sums(data, CENTROIDS, BOX)
    after = cluster_sums(np.vstack([data, extra]), CENTROIDS, BOX)
    assert np.abs(after - before).sum() <= sums_sensitivity(BOX) + 1e-9


def test_the_sensitivity_is_reached_at_a_corner():
    corner = np.array([[4.0, 1.0]])
    added = cluster_sums(corner, CENTROIDS, BOX)
    assert np.abs(added).sum() == pytest.approx(sums_sensitivity(BOX))  # 1 + (2 + 1)


@settings(max_examples=200, deadline=None)
@given(data=arrays(float, (5, 2), elements=coordinates), extra=arrays(float, 2, elements=coordinates))
def test_adding_one_record_moves_the_moments_by_at_most_their_sensitivity(data, extra):
    moved = np.abs(moments(np.vstack([data, extra]), BOX) - moments(data, BOX)).sum()
    assert moved <= moments_sensitivity(BOX) + 1e-9


def test_the_moments_sensitivity_is_reached_at_a_corner():
    assert np.abs(moments(np.array([[4.0, 1.0]]), BOX)).sum() == pytest.approx(moments_sensitivity(BOX))  # 1+3+5


def test_the_initialisation_noise_has_the_stated_scale():
    epsilon = 0.7
    scale = moments_sensitivity(BOX) / epsilon
    rng = np.random.default_rng(2)
    draws = np.concatenate([noisy_moments(np.empty((0, 2)), BOX, epsilon, rng).values for _ in range(800)])
    assert stats.kstest(draws, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert stats.kstest(draws, stats.laplace(scale=1.2 * scale).cdf).pvalue < 1e-3


def test_initial_centroids_are_finite_and_in_the_box_whatever_the_noise():
    rng = np.random.default_rng(0)
    for noisy in ([-5.0, 1e9, -1e9, -3.0, 1e12], [0.3, 1.0, 1.0, 1.0, 1.0], [50.0, 50.0, 0.0, 1e6, -7.0]):
        centroids = initial_centroids(np.array(noisy), 4, BOX, rng)
        assert np.all(np.isfinite(centroids)) and np.all(centroids >= BOX.low) and np.all(centroids <= BOX.high)


def test_dplloyd_noise_has_the_stated_scale():
    # on no records the release is pure noise, of scale Δ/ε per iteration
    epsilon = 0.5
    scale = sums_sensitivity(BOX) / epsilon
    rng = np.random.default_rng(1)
    draws = np.concatenate([noisy_sums(np.empty((0, 2)), CENTROIDS, BOX, epsilon, rng).values.ravel()
                            for _ in range(600)])
    assert stats.kstest(draws, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert stats.kstest(draws, stats.laplace(scale=1.2 * scale).cdf).pvalue < 1e-3


def test_dplloyd_costs_epsilon_in_all():
    x = np.random.default_rng(0).uniform(0, 1, size=(30, 2))
    _, event = dplloyd(x, 3, BOX, epsilon=0.8, iterations=4, rng=np.random.default_rng(0))
    assert make_accountant("basic").compose(event).epsilon(1e-5) == pytest.approx(0.8, rel=1e-6)


def test_empty_and_negative_noisy_counts_keep_the_centroid_and_stay_finite():
    noisy = np.array([[0.0, 5.0, 5.0], [-3.0, 1.0, 1.0], [0.2, 100.0, -100.0], [2.0, 1.0, 0.0]])
    previous = np.array([[1.0, 0.0], [2.0, 0.5], [3.0, -0.5], [0.5, 0.5]])
    new = update(noisy, previous, BOX)
    assert np.all(np.isfinite(new))
    assert np.array_equal(new[:3], previous[:3])
    assert np.allclose(new[3], [0.5 + 2.0, 0.0])  # mean of the centred sums, plus the box's centre
    # at ε tiny the noise dwarfs the counts: every update stays finite and in the box
    x = np.random.default_rng(0).uniform(0, 4, size=(20, 2))
    centroids, _ = dplloyd(x, 3, BOX, epsilon=1e-4, rng=np.random.default_rng(3))
    assert np.all(np.isfinite(centroids)) and np.all(centroids >= BOX.low) and np.all(centroids <= BOX.high)


def test_records_outside_the_bounds_are_clamped_not_used_to_move_them():
    far = np.array([[1e9, -1e9]])
    assert np.allclose(cluster_sums(far, CENTROIDS, BOX)[:, 1:].sum(axis=0), [4.0 - 2.0, -1.0 - 0.0])


def test_at_a_large_epsilon_both_approach_non_private_kmeans_on_iris():
    x, y = load_iris(return_X_y=True)
    box = Box(np.zeros(4), np.full(4, 8.0))
    lloyd = np.mean([clustering_accuracy(y, assign(x, dplloyd(x, 3, box, 1e4, rng=np.random.default_rng(s),
                                                                   init_rng=np.random.default_rng(s))[0]))
                     for s in range(3)])
    noisy, event = perturb_inputs(x, box, 1e4, rng=np.random.default_rng(0))
    assert lloyd > 0.8 and np.abs(noisy - x).max() < 0.1
    assert make_accountant("basic").compose(event).epsilon(1e-5) == pytest.approx(1e4, rel=1e-6)


@pytest.mark.parametrize("x, message", [  # NaN and ±∞ are clamped: tests/algorithms/test_nonfinite_records.py
    (np.zeros((2, 3)), "shape"),
])
def test_bad_records_are_clear_errors(x, message):
    with pytest.raises(ValueError, match=message):
        dplloyd(x, 2, BOX, 1.0)


def test_bad_bounds_are_clear_errors():
    with pytest.raises(ValueError, match="low < high"):
        Box(np.zeros(2), np.array([1.0, 0.0]))
