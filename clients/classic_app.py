"""ClientApp of the classic algorithms: a node answers a request with one noisy release
(the functional mechanism's coefficient sums, DPLloyd's per-cluster counts and sums, ...)
under its own policy and durable ledger.

Each algorithm is a ``ReleaseKind`` in ``RELEASES``: what a request costs, read off the
message alone, and how the node computes its noisy answer. Everything in the message is
the server's and untrusted: its numbers only set how much noise a release gets for the
sensitivity they imply, and the node books the cost in its ledger *before* it touches its
data, refusing what its budget does not allow (the same ``book`` as DP-SGD training). The
release must spend exactly the booked event. Noise comes from the OS CSPRNG unless the
node's policy says ``seeded``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import answer
from clients.releases import book, missing_data
from fedpriv.algorithms import dpdropout, dppca, iris, kmeans, linreg
from fedpriv.algorithms.datasets import LOADERS, client_share, load
from fedpriv.data import DatasetNotFoundError, check_available, load_dataset
from fedpriv.dpsgd import DPSGDConfig
from fedpriv.federation import protocol
from fedpriv.federation.policy import Randomness
from fedpriv.models import build_model
from fedpriv.node import checked_policy
from fedpriv.privacy.events import DpEvent, SelfComposedEvent, dpsgd_event
from fedpriv.seeding import derive_seed

CONFIG, ARRAYS, VALUES = "config", "arrays", "values"
MNIST_FEATURES = 28 * 28

app = ClientApp()


@dataclass(frozen=True)
class Request:
    """The server's request as a node reads it: each value checked when it is read."""

    config: ConfigRecord
    arrays: ArrayRecord

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise protocol.ProtocolError(f"message lacks array {name!r}")
        value = self.arrays[name].numpy().astype(float)
        if not np.all(np.isfinite(value)):
            raise protocol.ProtocolError(f"array {name!r} is not finite")
        return value

    def number(self, name: str) -> float:
        """A finite number from the config (``KeyError`` if missing: a refusal)."""
        value = float(self.config[name])
        if not np.isfinite(value):
            raise protocol.ProtocolError(f"{name} is not finite: {value!r}")
        return value

    @property
    def epsilon(self) -> float:
        epsilon = self.number("epsilon")
        if epsilon <= 0:
            raise protocol.ProtocolError(f"bad epsilon {epsilon!r}")
        return epsilon

    @property
    def dataset(self) -> str:
        name = str(self.config["dataset"])
        if name not in LOADERS:
            raise protocol.ProtocolError(f"unknown data set {name!r}")
        return name

    @property
    def seed(self) -> int:
        """The public seed of the data split (which records are train, which test)."""
        return int(self.config["seed"])


@dataclass(frozen=True)
class Node:
    """Which share of the data this node holds (its partition of ``clients``), and where its
    data files are (its policy's ``data-dir``: the node's, never the request's)."""

    client: int
    clients: int
    data_dir: Path | None = None

    def share(self, dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """This node's IID share of the training split of ``dataset``."""
        x_train, y_train, _, _ = load(dataset, seed)
        return client_share(x_train, y_train, self.client, self.clients, seed)


Rng = np.random.Generator | None
"""The noise generator of a release: ``None`` is the OS CSPRNG."""


@dataclass(frozen=True)
class ReleaseKind:
    """One algorithm's release: ``cost(request)`` is the event booked before any data is
    read, and reads (so checks) every value ``compute`` will use, so that a malformed
    request is refused before anything is booked; ``compute(request, node, rng)`` returns the flat noisy values and the event the
    release spent (it must equal the booked one)."""

    cost: Callable[[Request], DpEvent]
    compute: Callable[[Request, Node, Rng], tuple[np.ndarray, DpEvent]]
    ready: Callable[[Node], None] | None = None
    """Checks the node can compute the release (its data files exist), before anything is booked."""


def _linreg_bounds(request: Request) -> linreg.Bounds:
    target = request.array("target")
    return linreg.Bounds(request.array("low"), request.array("high"), (float(target[0]), float(target[1])))


def _linreg_cost(request: Request) -> DpEvent:
    _ = request.dataset, request.seed  # checked before anything is booked
    bounds = _linreg_bounds(request)
    return linreg.release_event(len(bounds.low), request.epsilon, request.number("quadratic-share"))


def _linreg(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    bounds = _linreg_bounds(request)
    x, y = node.share(request.dataset, request.seed)
    noisy, spent = linreg.privatise(linreg.coefficients(x, y, bounds), len(bounds.low), request.epsilon,
                                    request.number("quadratic-share"), rng)
    return np.concatenate([noisy.quadratic, noisy.linear]), spent


def _dplloyd_cost(request: Request) -> DpEvent:
    _ = request.dataset, request.seed  # checked before anything is booked
    return kmeans.release_event(len(request.array("centroids")), _box(request), request.epsilon)


def _dplloyd(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    x, _ = node.share(request.dataset, request.seed)
    out = kmeans.noisy_sums(x, request.array("centroids"), _box(request), request.epsilon, rng)
    return out.values.ravel(), out.event


def _moments_cost(request: Request) -> DpEvent:
    _ = request.dataset, request.seed  # checked before anything is booked
    return kmeans.moments_event(_box(request), request.epsilon)


def _moments(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    x, _ = node.share(request.dataset, request.seed)
    out = kmeans.noisy_moments(x, _box(request), request.epsilon, rng)
    return out.values, out.event


def _box(request: Request) -> kmeans.Box:
    return kmeans.Box(request.array("low"), request.array("high"))


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    """A model's parameters as one flat vector: what a training release sends."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()


def load_flat_weights(model: torch.nn.Module, weights: np.ndarray) -> torch.nn.Module:
    """``model`` with its parameters set from a flat vector (``flat_weights``' inverse)."""
    torch.nn.utils.vector_to_parameters(torch.as_tensor(weights, dtype=torch.float32), model.parameters())
    return model


def _ann_cost(request: Request) -> DpEvent:
    _ = request.dataset, request.seed, request.number("max-grad-norm"), request.number("lr")  # checked first
    if request.array("weights").shape != (iris.NUM_PARAMETERS,) or request.number("lot-size") <= 0:
        raise protocol.ProtocolError(f"weights must be {iris.NUM_PARAMETERS} numbers and lot-size > 0")
    return dpsgd_event(request.number("noise-multiplier"), request.number("sample-rate"), int(request.config["steps"]))


def _ann(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """DP-SGD from the server's weights on this node's share; the trained weights."""
    x, y = node.share(request.dataset, request.seed)
    model = load_flat_weights(iris.network(0), request.array("weights"))
    seeds = None if rng is None else (int(rng.integers(2**62)), int(rng.integers(2**62)))
    (event,) = iris.train(model, x, y.astype(int), noise_multiplier=request.number("noise-multiplier"),
                          sample_rate=request.number("sample-rate"), steps=int(request.config["steps"]),
                          max_grad_norm=request.number("max-grad-norm"), lr=request.number("lr"), seeds=seeds,
                          expected_lot_size=request.number("lot-size"))
    return flat_weights(model), event


def _answers_cost(request: Request) -> DpEvent:
    _ = request.dataset, request.seed  # checked before anything is booked
    queries = request.array("queries")
    if queries.ndim != 2 or queries.shape[1] != iris.NUM_FEATURES:
        raise protocol.ProtocolError(f"queries must have shape (m, {iris.NUM_FEATURES}), got {queries.shape}")
    return SelfComposedEvent(iris.answer_event(request.epsilon), len(queries))


def _answers(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """Laplace output perturbation of a network trained (without noise) on this node's share."""
    x, y = node.share(request.dataset, request.seed)
    model = iris.train_nonprivate(x, y.astype(int), request.seed)
    answers, event = iris.noisy_answers(model, request.array("queries"), request.epsilon, rng)
    return answers.ravel(), event


def _dpdropout_settings(request: Request) -> dpdropout.Settings:
    """One local epoch of the requested method at the server's rate q (``Settings`` checks
    every value; the placeholder lot size is unused under a fixed q)."""
    if request.dataset != "digits":
        raise protocol.ProtocolError(f"dpdropout runs on digits, not {request.dataset!r}")
    return dpdropout.Settings(method=str(request.config["method"]), hidden=int(request.config["hidden"]),
                              max_grad_norm=request.number("max-grad-norm"), lot_size=1, epochs=1,
                              lr=request.number("lr"), dropout=request.number("dropout"),
                              fixed_sample_rate=request.number("sample-rate"))


def _dpdropout_cost(request: Request) -> DpEvent:
    settings = _dpdropout_settings(request)
    _ = request.seed, request.number("lot-size"), int(request.config["step"])  # checked before anything is booked
    if request.array("weights").shape != (dpdropout.parameter_count(dpdropout.DIGITS_FEATURES, settings.hidden),):
        raise protocol.ProtocolError("weights do not fit the requested network")
    return dpsgd_event(request.number("noise-multiplier"), settings.sample_rate(1), settings.steps(1))


def _dpdropout(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """One local DPD epoch (round ``step`` + 1 of η0/t) from the server's weights; the trained weights."""
    settings = _dpdropout_settings(request)
    x, y = node.share(request.dataset, request.seed)
    model = load_flat_weights(dpdropout.network(dpdropout.DIGITS_FEATURES, settings, 0), request.array("weights"))
    epoch = int(request.config["step"]) + 1
    (event,) = dpdropout.train(model, dpdropout.digits_features(x), torch.as_tensor(y, dtype=torch.long), settings,
                               request.number("noise-multiplier"), epochs=range(epoch, epoch + 1),
                               seed=None if rng is None else int(rng.integers(2**62)),
                               expected_lot_size=request.number("lot-size"))
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


def _limit(request: Request) -> int:
    limit = int(request.config["limit-train"])
    if limit < 0:
        raise protocol.ProtocolError(f"limit-train must be >= 0, got {limit}")
    return limit


def _dppca_cost(request: Request) -> DpEvent:
    _ = request.seed, _limit(request)  # checked before anything is booked
    return dppca.pca_event(request.number("noise-multiplier"), request.number("sample-rate"))


def _dppca(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """This node's noisy Σ x xᵀ of its unit-norm MNIST training images (an IID share)."""
    x, _ = _mnist_share(node, _limit(request), request.seed)
    generators = {} if rng is None else {name: torch.Generator().manual_seed(int(rng.integers(2**62)))
                                         for name in ("sampling_generator", "noise_generator")}
    release = dppca.noisy_second_moment(x, request.number("noise-multiplier"),
                                        request.number("sample-rate"), secure_mode=rng is None, **generators)
    return release.matrix.numpy().ravel(), release.event


def _dppca_projection(request: Request) -> torch.Tensor:
    """The server's projection, untrusted: finite, (784 × dims), orthonormal columns."""
    try:
        return dppca.check_projection(request.array("projection"), MNIST_FEATURES)
    except ValueError as err:
        raise protocol.ProtocolError(str(err)) from err


def _dppca_mlp(request: Request, dims: int) -> torch.nn.Module:
    """The MLP (dims → 1000 → 10) holding the server's weights, which must fit it."""
    model = build_model("mlp", 0, in_features=dims)
    weights = request.array("weights")
    if weights.shape != (sum(p.numel() for p in model.parameters()),):
        raise protocol.ProtocolError(f"weights do not fit the {dims}-input MLP")
    return load_flat_weights(model, weights)


def _dppca_train_cost(request: Request) -> DpEvent:
    """One round of local DP-SGD on the projected images: every value checked (the
    projection, the weights, the engine's config) before anything is booked."""
    _ = request.seed, _limit(request), _dppca_mlp(request, _dppca_projection(request).shape[1])
    steps, lot_size, lr = int(request.config["steps"]), request.number("lot-size"), request.number("lr")
    if steps < 1 or lot_size <= 0 or lr <= 0:
        raise protocol.ProtocolError("steps must be >= 1, lot-size and lr > 0")
    config = DPSGDConfig(noise_multiplier=request.number("noise-multiplier"),
                         max_grad_norm=request.number("max-grad-norm"), sample_rate=request.number("sample-rate"))
    return dpsgd_event(config.noise_multiplier, config.sample_rate, steps)


def _dppca_train(request: Request, node: Node, rng: Rng) -> tuple[np.ndarray, DpEvent]:
    """DP-SGD from the server's weights on this node's share, projected by the server's
    (checked) projection; the trained weights."""
    projection = _dppca_projection(request)
    model = _dppca_mlp(request, projection.shape[1])
    x, y = _mnist_share(node, _limit(request), request.seed)
    seeds = None if rng is None else (int(rng.integers(2**62)), int(rng.integers(2**62)))
    (event,) = dppca.train_mlp(model, dppca.project(x, projection, dppca.INPUT_SCALE), y,
                               noise_multiplier=request.number("noise-multiplier"),
                               sample_rate=request.number("sample-rate"), steps=int(request.config["steps"]),
                               max_grad_norm=request.number("max-grad-norm"), lr=request.number("lr"), seeds=seeds,
                               expected_lot_size=request.number("lot-size"))
    return flat_weights(model), event


RELEASES: dict[str, ReleaseKind] = {
    "linreg": ReleaseKind(_linreg_cost, _linreg),
    "kmeans-moments": ReleaseKind(_moments_cost, _moments),
    "kmeans-dplloyd": ReleaseKind(_dplloyd_cost, _dplloyd),
    "ann-iris": ReleaseKind(_ann_cost, _ann),
    "output-perturbation": ReleaseKind(_answers_cost, _answers),
    "dpdropout": ReleaseKind(_dpdropout_cost, _dpdropout),
    "dppca": ReleaseKind(_dppca_cost, _dppca, _mnist_ready),
    "dppca-train": ReleaseKind(_dppca_train_cost, _dppca_train, _mnist_ready),
}


def entry(run_key: str, algorithm: str, step: int) -> str:
    """The ledger entry of one release: a node never answers one twice."""
    return f"{protocol.check_run_key(run_key)}/{algorithm}/step-{step}"


def release(msg: Message, context: Context) -> RecordDict:
    """Book, then compute and noise this node's statistic for the requested step."""
    policy = checked_policy(context.node_config)
    node = Node(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]), policy.data_dir)
    request = Request(msg.content.config_records[CONFIG], msg.content.array_records[ARRAYS])
    algorithm = str(request.config["algorithm"])
    if algorithm not in RELEASES:
        raise protocol.ProtocolError(f"unknown algorithm {algorithm!r}")
    kind = RELEASES[algorithm]
    key = entry(str(request.config["run-key"]), algorithm, int(request.config["step"]))
    event = kind.cost(request)
    if kind.ready is not None:
        kind.ready(node)
    ordinal = book(policy, str(node.client), key, (event,), policy.budget)  # before the data is read
    # seeded (simulations): a stream per node and per entry, so two nodes given one seed never draw the same noise
    rng = (None if policy.randomness is Randomness.SECURE
           else np.random.default_rng(derive_seed(policy.seed or 0, "release", node.client, ordinal)))
    values, spent = kind.compute(request, node, rng)
    if spent != event:  # a bug of the kind, not bad input: nothing leaves (and no assert that -O would strip)
        raise RuntimeError(f"{algorithm}: the release spent {spent}, not the booked {event}; nothing is sent")
    return RecordDict({VALUES: ArrayRecord({VALUES: Array(np.asarray(values, float))}),
                       protocol.PRIVACY: protocol.events_record(key, (event,))})


@app.query()
def query(msg: Message, context: Context) -> Message:
    """One noisy release of this node's statistic; or a refusal saying why."""
    return answer(release, msg, context)
