"""A curious or careless server sends classic requests a node cannot compute: bounds or
centroids of the wrong dimension for the data set, a quadratic share outside (0, 1), a box
whose ranges overflow, a DP-SGD request for another data set. Each is refused before
anything is booked (it once was booked, then failed: twenty such requests spent a node's
budget with nothing released), with a one-line reason; a request that crashed before
booking is a refusal too."""

import math

import numpy as np
import pytest

from clients.classic.algorithms import TRAINING_SHAPES, Node, Share
from clients.classic.client_app import app
from fedpriv.algorithms import dpdropout, iris
from fedpriv.algorithms.datasets import client_share, load
from fedpriv.data import load_dataset
from fedpriv.privacy.events import LaplaceEvent
from server.classic.loops import Shares, _ask
from tests.flower.inprocess import InProcessGrid, booked, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

LINREG = ({"algorithm": "linreg", "dataset": "diabetes", "seed": 0, "epsilon": 1.0, "quadratic-share": 0.5},
          {"low": np.full(10, -0.2), "high": np.full(10, 0.2), "target": np.array([25.0, 346.0])})
BOX = {"low": np.zeros(4), "high": np.full(4, 8.0)}
MOMENTS = ({"algorithm": "kmeans-moments", "dataset": "iris", "seed": 0, "epsilon": 1.0}, BOX)
DPLLOYD = ({"algorithm": "kmeans-dplloyd", "dataset": "iris", "seed": 0, "epsilon": 1.0},
           {**BOX, "centroids": np.full((3, 4), 4.0)})
ANN = ({"algorithm": "ann-iris", "dataset": "iris", "seed": 0, "noise-multiplier": 1.0, "sample-rate": 0.5,
        "steps": 2, "max-grad-norm": 1.0, "lr": 0.1, "lot-size": 20.0}, {"weights": np.zeros(iris.NUM_PARAMETERS)})
ANSWERS = ({"algorithm": "output-perturbation", "dataset": "iris", "seed": 0, "epsilon": 1.0},
           {"queries": np.ones((2, iris.NUM_FEATURES))})
DROPOUT = ({"algorithm": "dpdropout", "dataset": "digits", "seed": 0, "method": "dpd", "hidden": 8,
            "noise-multiplier": 1.0, "sample-rate": 0.1, "lot-size": 20.0, "max-grad-norm": 1.0, "lr": 0.1,
            "dropout": 0.5}, {"weights": np.zeros(dpdropout.parameter_count(dpdropout.DIGITS_FEATURES, 8))})
DPPCA = ({"algorithm": "dppca", "seed": 0, "noise-multiplier": 12.4, "sample-rate": 1.0, "limit-train": 400}, {})


def _with(request, config=None, arrays=None, drop=()):
    base_config, base_arrays = request
    merged = {**base_config, **(config or {})}, {**base_arrays, **(arrays or {})}
    return {k: v for k, v in merged[0].items() if k not in drop}, merged[1]


MALFORMED = {
    "linreg: 9 bounds for 10 features": (_with(LINREG, arrays={"low": np.full(9, -0.2), "high": np.full(9, 0.2)}),
                                         "low must have shape (10)"),
    "linreg: quadratic share 1": (_with(LINREG, {"quadratic-share": 1.0}), "quadratic-share"),
    "linreg: quadratic share 1.5": (_with(LINREG, {"quadratic-share": 1.5}), "quadratic-share"),
    "linreg: quadratic share 0": (_with(LINREG, {"quadratic-share": 0.0}), "quadratic-share"),
    "linreg: a box of +-1e308": (_with(LINREG, arrays={"low": np.full(10, -1e308), "high": np.full(10, 1e308)}),
                                 "finite ranges"),
    "linreg: a box with a NaN": (_with(LINREG, arrays={"low": np.r_[np.nan, np.full(9, -0.2)]}), "not finite"),
    "linreg: three target bounds": (_with(LINREG, arrays={"target": np.array([1.0, 2.0, 3.0])}), "target"),
    "linreg: target low > high": (_with(LINREG, arrays={"target": np.array([346.0, 25.0])}), "target"),
    "linreg: infinite epsilon": (_with(LINREG, {"epsilon": math.inf}), "epsilon"),
    "linreg: a negative seed": (_with(LINREG, {"seed": -1}), "seed"),
    "linreg: epsilon as text": (_with(LINREG, {"epsilon": "1"}), "epsilon"),
    "linreg: no quadratic share": (_with(LINREG, drop=("quadratic-share",)), "quadratic-share"),
    "linreg: another data set": (_with(LINREG, {"dataset": "mnist"}), "unknown data set"),
    "moments: a 3-d box for 4 features": (_with(MOMENTS, arrays={"low": np.zeros(3), "high": np.ones(3)}),
                                          "low must have shape (4)"),
    "moments: a box whose squared range overflows": (_with(MOMENTS, arrays={"low": np.full(4, -1e200),
                                                                            "high": np.full(4, 1e200)}),
                                                     "finite ranges"),
    "dplloyd: centroids of 5 coordinates": (_with(DPLLOYD, arrays={"centroids": np.ones((3, 5))}), "centroids"),
    "dplloyd: no centroid": (_with(DPLLOYD, arrays={"centroids": np.ones((0, 4))}), "centroids"),
    "dplloyd: flat centroids": (_with(DPLLOYD, arrays={"centroids": np.ones(12)}), "centroids"),
    "ann: on diabetes": (_with(ANN, {"dataset": "diabetes"}), "runs on iris"),
    "ann: sample rate 1.5": (_with(ANN, {"sample-rate": 1.5}), "sample_rate"),
    "ann: zero steps": (_with(ANN, {"steps": 0}), "steps"),
    "ann: negative lr": (_with(ANN, {"lr": -0.1}), "lr"),
    "ann: zero clipping norm": (_with(ANN, {"max-grad-norm": 0.0}), "max-grad-norm"),
    "answers: no query": (_with(ANSWERS, arrays={"queries": np.ones((0, 4))}), "queries"),
    "answers: on digits": (_with(ANSWERS, {"dataset": "digits"}), "runs on iris"),
    "dpdropout: a negative round": (_with(DROPOUT, {"step": -1}), "step"),
    "dpdropout: another network's weights": (_with(DROPOUT, arrays={"weights": np.zeros(10)}), "weights"),
    "dpdropout: an unknown method": (_with(DROPOUT, {"method": "magic"}), "method"),
    "dppca: a negative limit": (_with(DPPCA, {"limit-train": -1}), "limit-train"),
    "dppca: sample rate 0": (_with(DPPCA, {"sample-rate": 0.0}), "sample_rate"),
    "dppca: negative noise": (_with(DPPCA, {"noise-multiplier": -1.0}), "noise_multiplier"),
}


def _grid(tmp_path, data_dir):
    nodes = {i: node_config(i, 2, tmp_path, **{"epsilon-budget": 1e9, "randomness": "seeded", "seed": 1,
                                               "data-dir": str(data_dir)}) for i in range(2)}
    return InProcessGrid({}, nodes, client_app=app)


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_classic_request_is_refused_and_books_nothing(shared_data_dir, tmp_path, case):
    (config, arrays), reason = MALFORMED[case]
    config = {"step": 0, "run-key": "run-malformed", **config}
    shares = Shares()
    _, accepted = _ask(_grid(tmp_path, shared_data_dir), config, arrays, 1, LaplaceEvent(1.0), shares)
    assert accepted == 0 and len(shares.refused) == 2
    for refusal in shares.refused.values():
        assert reason in refusal and "\n" not in refusal, refusal
    assert not booked(tmp_path / "node0") and not booked(tmp_path / "node1")


@pytest.mark.parametrize("request_", [LINREG, MOMENTS, DPLLOYD, ANN, ANSWERS, DROPOUT],
                         ids=["linreg", "moments", "dplloyd", "ann", "answers", "dpdropout"])
def test_each_well_formed_request_is_answered(shared_data_dir, tmp_path, request_):
    """The checks refuse only what is malformed: the base request of each case above is answered."""
    config, arrays = request_
    grid = _grid(tmp_path, shared_data_dir)
    _ask(grid, {"step": 0, "run-key": "run-fine", **config}, arrays, 1, LaplaceEvent(1.0), Shares())
    assert len(grid.log) == 2 and not any(reply.has_error() for reply in grid.log)


@pytest.mark.parametrize("dataset", ["diabetes", "iris", "digits"])
def test_the_public_shapes_are_the_data_sets_and_the_share_sizes_their_shares(dataset):
    """The shapes a request is checked against, and the share sizes δ is checked against,
    are those of the data the node reads (scikit-learn's, split as ``load`` splits it)."""
    x_train, y_train, _, _ = load(dataset, 3)
    assert TRAINING_SHAPES[dataset] == x_train.shape
    for clients in (1, 3, 7):
        for client in range(clients):
            x, _ = client_share(x_train, y_train, client, clients, 3)
            assert Share(dataset, 3).size(Node(client, clients)) == len(x)


def test_the_mnist_shape_is_the_training_sets(shared_data_dir):
    train = load_dataset("mnist", str(shared_data_dir), train=True)
    assert TRAINING_SHAPES["mnist"] == (len(train.labels), int(np.prod(train.features.shape[1:])))
    assert Share("mnist", 0, limit=401).size(Node(0, 2)) == len(np.array_split(np.arange(401), 2)[0])
    assert Share("mnist", 0).size(Node(1, 7)) == len(np.array_split(np.arange(len(train.labels)), 7)[1])
