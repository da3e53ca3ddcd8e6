"""A record holding a NaN or ±∞ never makes a classic release fail (a failure would be an
unbooked bit that depends on the data): it is brought into the user's box by a fixed
per-record rule (±∞ to the bound, NaN to the midpoint; DP-PCA: the zero record), and the
release equals, with the same seed, the release on the data with that record so treated."""

import numpy as np
import torch

from fedpriv.algorithms import dppca, iris, kmeans, linreg
from fedpriv.algorithms.box import Box

BOX = Box(np.array([0.0, -2.0, 1.0]), np.array([4.0, 2.0, 3.0]))
MIDDLE = np.array([2.0, 0.0, 2.0])  # (low + high) / 2, by hand


def _records(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).uniform(BOX.low, BOX.high, size=(40, 3))
    bad, fixed = x.copy(), x.copy()
    bad[3] = [np.nan, np.inf, -np.inf]
    fixed[3] = [MIDDLE[0], BOX.high[1], BOX.low[2]]
    bad[7, 1], fixed[7, 1] = np.nan, MIDDLE[1]
    return bad, fixed


def test_fm_regression_releases_as_if_the_bad_record_were_clamped_into_the_bounds():
    (x_bad, x_fixed), y = _records(), np.linspace(0.0, 1.0, 40)
    y_bad, y_fixed = y.copy(), y.copy()
    y_bad[5], y_fixed[5] = np.nan, 0.5  # the target range's midpoint
    y_bad[6], y_fixed[6] = -np.inf, 0.0
    bounds = linreg.Bounds(BOX.low, BOX.high, (0.0, 1.0))
    bad, _ = linreg.fit(x_bad, y_bad, bounds, 1.0, rng=np.random.default_rng(4))
    fixed, _ = linreg.fit(x_fixed, y_fixed, bounds, 1.0, rng=np.random.default_rng(4))
    assert np.all(np.isfinite(bad)) and np.array_equal(bad, fixed)


def test_dplloyd_and_its_releases_treat_the_bad_record_as_clamped_into_the_box():
    x_bad, x_fixed = _records()
    centroids = np.array([[1.0, 0.0, 2.0], [3.0, 1.0, 2.5]])
    for release in (lambda x: kmeans.noisy_sums(x, centroids, BOX, 1.0, np.random.default_rng(1)).values,
                    lambda x: kmeans.noisy_moments(x, BOX, 1.0, np.random.default_rng(1)).values,
                    lambda x: kmeans.dplloyd(x, 2, BOX, 1.0, rng=np.random.default_rng(1),
                                             init_rng=np.random.default_rng(2))[0],
                    lambda x: kmeans.perturb_inputs(x, BOX, 1.0, rng=np.random.default_rng(1))[0]):
        bad = release(x_bad)
        assert np.all(np.isfinite(bad)) and np.array_equal(bad, release(x_fixed))


def test_iris_models_and_answers_treat_a_bad_measurement_as_the_box_middle():
    x = np.random.default_rng(0).uniform(*iris.BOX, size=(30, 4))
    y = np.arange(30) % 3
    bad, fixed = x.copy(), x.copy()
    bad[2] = [np.nan, np.inf, -np.inf, 1.0]
    fixed[2] = [4.0, 8.0, 0.0, 1.0]  # the box [0, 8]: middle, top, bottom
    weights = [torch.nn.utils.parameters_to_vector(iris.train_nonprivate(d, y, epochs=20).parameters())
               for d in (bad, fixed)]
    assert torch.isfinite(weights[0]).all() and torch.equal(*weights)
    model = iris.network(0)
    answers = [iris.noisy_answers(model, q[:3], 1.0, np.random.default_rng(3))[0] for q in (bad, fixed)]
    assert np.array_equal(*answers)


def test_dppca_treats_a_non_finite_record_as_the_zero_record():
    x = torch.rand(20, 6, generator=torch.Generator().manual_seed(0))
    bad, fixed = x.clone(), x.clone()
    bad[4, 2], bad[9, 0] = float("nan"), float("inf")
    fixed[4], fixed[9] = 0.0, 0.0

    def release(records):
        generators = {name: torch.Generator().manual_seed(seed)
                      for name, seed in (("sampling_generator", 1), ("noise_generator", 2))}
        return dppca.noisy_second_moment(records, 1.0, 0.5, **generators).matrix

    assert torch.isfinite(release(bad)).all() and torch.equal(release(bad), release(fixed))
