"""The classic algorithms a node releases for (``clients.classic.client_app``): each an
``Algorithm`` in ``RELEASES``, whose ``parse`` reads a request once and checks every value the
release will use, against the data set's public shape too (its number of features, the size
of the node's share: never its records), and returns the parsed values with the event the
release costs; ``compute`` uses only those values and returns what it released with the
event it spent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from clients.releases import missing_data
from fedpriv.algorithms import dpdropout, dppca, iris, kmeans, linreg
from fedpriv.algorithms.datasets import client_share, load
from fedpriv.data import DatasetNotFoundError, check_available, load_dataset
from fedpriv.dpsgd import DPSGDConfig
from fedpriv.federation import protocol
from fedpriv.federation.classic_protocol import Request, flat_weights, load_flat_weights
from fedpriv.models import build_model
from fedpriv.privacy.events import DpEvent, SelfComposedEvent, dpsgd_event

MNIST_FEATURES = 28 * 28
TRAINING_SHAPES = {"diabetes": (354, 10), "iris": (120, 4), "digits": (1438, 64), "mnist": (60000, MNIST_FEATURES)}
"""(records, features) of each data set's training split: public (the data set's format),
so a request is checked against them before the node reads a record."""


@dataclass(frozen=True)
class Node:
    """Which share of the data this node holds (its partition of ``clients``), and where its
    data files are (its policy's ``data-dir``: the node's, never the request's)."""

    client: int
    clients: int
    data_dir: Path | None = None


@dataclass(frozen=True)
class Share:
    """The data a release reads: the node's IID share of ``dataset``'s training split (split
    by the public ``seed``; MNIST: of its first ``limit`` images, 0 all)."""

    dataset: str
    seed: int
    limit: int = 0

    @property
    def features(self) -> int:
        return TRAINING_SHAPES[self.dataset][1]

    def size(self, node: Node) -> int:
        """The share's number of records, from the public shape alone (no record is read)."""
        records = TRAINING_SHAPES[self.dataset][0]
        records = min(self.limit, records) if self.limit else records
        return records // node.clients + (node.client < records % node.clients)  # numpy's array_split

    def records(self, node: Node) -> tuple[np.ndarray, np.ndarray]:
        """The share itself (a scikit-learn data set's)."""
        x_train, y_train, _, _ = load(self.dataset, self.seed)
        return client_share(x_train, y_train, node.client, node.clients, self.seed)


Rng = np.random.Generator | None
"""The noise generator of a release: ``None`` is the OS CSPRNG."""

P = TypeVar("P")


@dataclass(frozen=True)
class Algorithm(Generic[P]):
    """One algorithm's release: ``parse(request)`` returns its checked values (with the
    ``Share`` it reads as ``.share``) and the event booked before any data is read;
    ``compute(values, node, rng)`` the flat noisy values and the event the release spent
    (it must equal the booked one)."""

    parse: Callable[[Request], tuple[P, DpEvent]]
    compute: Callable[[P, Node, Rng], tuple[np.ndarray, DpEvent]]
    ready: Callable[[Node], None] | None = None
    """Checks the node can compute the release (its data files exist), before anything is booked."""


def _share(request: Request, *, dataset: str | None = None) -> Share:
    """The request's data set (``dataset`` where the algorithm runs on that one only) and seed."""
    name = request.dataset
    if dataset is not None and name != dataset:
        raise protocol.ProtocolError(f"{request.text('algorithm')} runs on {dataset}, not {name!r}")
    return Share(name, request.seed)


def _shaped(request: Request, name: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """Array ``name``, of ``shape`` (``None``: any length ≥ 1 on that axis)."""
    value = request.array(name)
    if len(value.shape) != len(shape) or any(want is not None and got != want or got < 1
                                             for got, want in zip(value.shape, shape, strict=True)):
        wanted = ", ".join("m" if s is None else str(s) for s in shape)
        raise protocol.ProtocolError(f"{name} must have shape ({wanted}), got {value.shape}")
    return value


def _box(request: Request, share: Share) -> kmeans.Box:
    """The stated box of the share's records: finite, low < high, with finite ranges."""
    low, high = _shaped(request, "low", (share.features,)), _shaped(request, "high", (share.features,))
    with np.errstate(over="ignore"):  # an overflow is what this checks for
        ranges = high - low
        finite = np.all(np.isfinite(ranges)) and np.all(np.isfinite(ranges**2))
    if not (np.all(low < high) and finite):
        raise protocol.ProtocolError("the box must have low < high and finite ranges")
    return kmeans.Box(low, high)


@dataclass(frozen=True)
class Regression:
    share: Share
    bounds: linreg.Bounds
    epsilon: float
    quadratic_share: float


def _parse_linreg(request: Request) -> tuple[Regression, DpEvent]:
    share = _share(request)
    box, target = _box(request, share), _shaped(request, "target", (2,))
    quadratic_share = request.number("quadratic-share")
    if not 0 < quadratic_share < 1:
        raise protocol.ProtocolError(f"quadratic-share must be in (0, 1), got {quadratic_share!r}")
    params = Regression(share, linreg.Bounds(box.low, box.high, (float(target[0]), float(target[1]))),
                        request.epsilon, quadratic_share)
    return params, linreg.release_event(share.features, params.epsilon, quadratic_share)


def _linreg(params: Regression, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    x, y = params.share.records(node)
    noisy, spent = linreg.privatise(linreg.coefficients(x, y, params.bounds), params.share.features, params.epsilon,
                                    params.quadratic_share, rng)
    return np.concatenate([noisy.quadratic, noisy.linear]), spent


@dataclass(frozen=True)
class Clustering:
    share: Share
    box: kmeans.Box
    epsilon: float


@dataclass(frozen=True)
class Lloyd(Clustering):
    centroids: np.ndarray


def _parse_moments(request: Request) -> tuple[Clustering, DpEvent]:
    share = _share(request)
    params = Clustering(share, _box(request, share), request.epsilon)
    return params, kmeans.moments_event(params.box, params.epsilon)


def _moments(params: Clustering, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    x, _ = params.share.records(node)
    out = kmeans.noisy_moments(x, params.box, params.epsilon, rng)
    return out.values, out.event


def _parse_dplloyd(request: Request) -> tuple[Lloyd, DpEvent]:
    share = _share(request)
    params = Lloyd(share, _box(request, share), request.epsilon, _shaped(request, "centroids", (None, share.features)))
    return params, kmeans.release_event(len(params.centroids), params.box, params.epsilon)


def _dplloyd(params: Lloyd, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    x, _ = params.share.records(node)
    out = kmeans.noisy_sums(x, params.centroids, params.box, params.epsilon, rng)
    return out.values.ravel(), out.event


@dataclass(frozen=True)
class Sgd:
    """A DP-SGD request's values (σ, q and C checked as the engine checks them)."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float
    lr: float
    lot_size: float

    @classmethod
    def parse(cls, request: Request) -> Sgd:
        config = DPSGDConfig(noise_multiplier=request.number("noise-multiplier"),
                             max_grad_norm=request.positive("max-grad-norm"),
                             sample_rate=request.number("sample-rate"))
        return cls(config.noise_multiplier, config.sample_rate, request.integer("steps", 1), config.max_grad_norm,
                   request.positive("lr"), request.positive("lot-size"))

    @property
    def event(self) -> DpEvent:
        return dpsgd_event(self.noise_multiplier, self.sample_rate, self.steps)

    def train_kwargs(self, rng: Rng) -> dict[str, Any]:
        """The keywords of ``iris.train`` and ``dppca.train_mlp``; seeds from ``rng``, if seeded."""
        seeds = None if rng is None else (int(rng.integers(2**62)), int(rng.integers(2**62)))
        return {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate, "steps": self.steps,
                "max_grad_norm": self.max_grad_norm, "lr": self.lr, "seeds": seeds,
                "expected_lot_size": self.lot_size}


@dataclass(frozen=True)
class Training:
    share: Share
    sgd: Sgd
    weights: np.ndarray


def _parse_ann(request: Request) -> tuple[Training, DpEvent]:
    params = Training(_share(request, dataset="iris"), Sgd.parse(request),
                      _shaped(request, "weights", (iris.NUM_PARAMETERS,)))
    return params, params.sgd.event


def _ann(params: Training, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """DP-SGD from the server's weights on this node's share; the trained weights."""
    x, y = params.share.records(node)
    model = load_flat_weights(iris.network(0), params.weights)
    (event,) = iris.train(model, x, y.astype(int), **params.sgd.train_kwargs(rng))
    return flat_weights(model), event


@dataclass(frozen=True)
class Answers:
    share: Share
    queries: np.ndarray
    epsilon: float


def _parse_answers(request: Request) -> tuple[Answers, DpEvent]:
    params = Answers(_share(request, dataset="iris"), _shaped(request, "queries", (None, iris.NUM_FEATURES)),
                     request.epsilon)
    return params, SelfComposedEvent(iris.answer_event(params.epsilon), len(params.queries))


def _answers(params: Answers, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """Laplace output perturbation of a network trained (without noise) on this node's share."""
    x, y = params.share.records(node)
    model = iris.train_nonprivate(x, y.astype(int), params.share.seed)
    answers, event = iris.noisy_answers(model, params.queries, params.epsilon, rng)
    return answers.ravel(), event


@dataclass(frozen=True)
class Dropout:
    share: Share
    settings: dpdropout.Settings
    noise_multiplier: float
    lot_size: float
    epoch: int
    weights: np.ndarray


def _parse_dpdropout(request: Request) -> tuple[Dropout, DpEvent]:
    """One local epoch (round ``step`` + 1 of η0/t) of the requested method at the server's
    rate q (``Settings`` checks every value; the placeholder lot size is unused under a fixed q)."""
    share = _share(request, dataset="digits")
    settings = dpdropout.Settings(method=request.text("method"), hidden=request.integer("hidden", 1),
                                  max_grad_norm=request.number("max-grad-norm"), lot_size=1, epochs=1,
                                  lr=request.number("lr"), dropout=request.number("dropout"),
                                  fixed_sample_rate=request.number("sample-rate"))
    weights = _shaped(request, "weights", (dpdropout.parameter_count(share.features, settings.hidden),))
    params = Dropout(share, settings, request.number("noise-multiplier"), request.positive("lot-size"),
                     request.integer("step") + 1, weights)
    return params, dpsgd_event(params.noise_multiplier, settings.sample_rate(1), settings.steps(1))


def _dpdropout(params: Dropout, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """One local DPD epoch from the server's weights; the trained weights."""
    x, y = params.share.records(node)
    model = load_flat_weights(dpdropout.network(params.share.features, params.settings, 0), params.weights)
    (event,) = dpdropout.train(model, dpdropout.digits_features(x), torch.as_tensor(y, dtype=torch.long),
                               params.settings, params.noise_multiplier, epochs=range(params.epoch, params.epoch + 1),
                               seed=None if rng is None else int(rng.integers(2**62)),
                               expected_lot_size=params.lot_size)
    return flat_weights(model), event


def _mnist_ready(node: Node) -> None:
    """The node's own MNIST folder (its policy's ``data-dir``) must hold MNIST; the refusal
    does not tell the server the node's path."""
    try:
        check_available("mnist", None if node.data_dir is None else str(node.data_dir))
    except DatasetNotFoundError as err:
        raise missing_data("MNIST") from err


@functools.lru_cache(maxsize=4)  # a simulation's actor may serve several nodes in turn
def _mnist_share(node: Node, limit: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's IID share of its MNIST training images (the first ``limit``; 0: all),
    read from its own ``data-dir`` (cached: every training round reads it)."""
    train = load_dataset("mnist", None if node.data_dir is None else str(node.data_dir), train=True,
                         limit=limit or None)
    x, y = client_share(train.features.numpy(), train.labels.numpy(), node.client, node.clients, seed)
    return torch.from_numpy(x), torch.from_numpy(y).long()


def _mnist(request: Request) -> Share:
    return Share("mnist", request.seed, request.integer("limit-train"))


@dataclass(frozen=True)
class Moment:
    share: Share
    noise_multiplier: float
    sample_rate: float


def _parse_dppca(request: Request) -> tuple[Moment, DpEvent]:
    params = Moment(_mnist(request), request.number("noise-multiplier"), request.number("sample-rate"))
    return params, dppca.pca_event(params.noise_multiplier, params.sample_rate)


def _dppca(params: Moment, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """This node's noisy Σ x xᵀ of its unit-norm MNIST training images (an IID share)."""
    x, _ = _mnist_share(node, params.share.limit, params.share.seed)
    generators = {} if rng is None else {name: torch.Generator().manual_seed(int(rng.integers(2**62)))
                                         for name in ("sampling_generator", "noise_generator")}
    release = dppca.noisy_second_moment(x, params.noise_multiplier, params.sample_rate, secure_mode=rng is None,
                                        **generators)
    return release.matrix.numpy().ravel(), release.event


@dataclass(frozen=True)
class ProjectedTraining:
    share: Share
    sgd: Sgd
    projection: torch.Tensor
    weights: np.ndarray


def _parse_dppca_train(request: Request) -> tuple[ProjectedTraining, DpEvent]:
    """One round of local DP-SGD on the projected images: the server's projection (finite,
    784 × dims, orthonormal columns), the weights of the dims → 1000 → 10 MLP, the engine's config."""
    share = _mnist(request)
    projection = dppca.check_projection(request.array("projection"), share.features)
    weights, model = request.array("weights"), build_model("mlp", 0, in_features=projection.shape[1])
    if weights.shape != (sum(p.numel() for p in model.parameters()),):
        raise protocol.ProtocolError(f"weights do not fit the {projection.shape[1]}-input MLP")
    params = ProjectedTraining(share, Sgd.parse(request), projection, weights)
    return params, params.sgd.event


def _dppca_train(params: ProjectedTraining, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """DP-SGD from the server's weights on this node's share, projected by the server's
    (checked) projection; the trained weights."""
    model = load_flat_weights(build_model("mlp", 0, in_features=params.projection.shape[1]), params.weights)
    x, y = _mnist_share(node, params.share.limit, params.share.seed)
    (event,) = dppca.train_mlp(model, dppca.project(x, params.projection, dppca.INPUT_SCALE), y,
                               **params.sgd.train_kwargs(rng))
    return flat_weights(model), event


RELEASES: dict[str, Algorithm[Any]] = {
    "linreg": Algorithm(_parse_linreg, _linreg),
    "kmeans-moments": Algorithm(_parse_moments, _moments),
    "kmeans-dplloyd": Algorithm(_parse_dplloyd, _dplloyd),
    "ann-iris": Algorithm(_parse_ann, _ann),
    "output-perturbation": Algorithm(_parse_answers, _answers),
    "dpdropout": Algorithm(_parse_dpdropout, _dpdropout),
    "dppca": Algorithm(_parse_dppca, _dppca, _mnist_ready),
    "dppca-train": Algorithm(_parse_dppca_train, _dppca_train, _mnist_ready),
}


def parse(request: Request) -> tuple[Algorithm[Any], Any, DpEvent]:
    """The request's algorithm, its checked values and what it costs; ``ProtocolError`` (one
    line, from the request alone: no data is read) on anything a release could not compute."""
    algorithm = request.text("algorithm")
    if algorithm not in RELEASES:
        raise protocol.ProtocolError(f"unknown algorithm {algorithm!r}")
    kind = RELEASES[algorithm]
    try:
        params, event = kind.parse(request)
    except protocol.ProtocolError:
        raise
    except Exception as err:  # a value the algorithm or its accountant cannot take: the request's fault
        raise protocol.ProtocolError(f"bad {algorithm} request: {' '.join(str(err).split())}") from err
    return kind, params, event


