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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import answer
from clients.releases import book
from fedpriv.algorithms import kmeans, linreg
from fedpriv.algorithms.datasets import LOADERS, client_share, load
from fedpriv.federation import protocol
from fedpriv.federation.policy import Randomness, load_policy
from fedpriv.privacy.events import DpEvent

CONFIG, ARRAYS, VALUES = "config", "arrays", "values"

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
    """Which share of the data this node holds (its partition of ``clients``)."""

    client: int
    clients: int

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


RELEASES: dict[str, ReleaseKind] = {
    "linreg": ReleaseKind(_linreg_cost, _linreg),
    "kmeans-moments": ReleaseKind(_moments_cost, _moments),
    "kmeans-dplloyd": ReleaseKind(_dplloyd_cost, _dplloyd),
}


def entry(run_key: str, algorithm: str, step: int) -> str:
    """The ledger entry of one release: a node never answers one twice."""
    return f"{protocol.check_run_key(run_key)}/{algorithm}/step-{step}"


def release(msg: Message, context: Context) -> RecordDict:
    """Book, then compute and noise this node's statistic for the requested step."""
    policy = load_policy(context.node_config)
    node = Node(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    request = Request(msg.content.config_records[CONFIG], msg.content.array_records[ARRAYS])
    algorithm = str(request.config["algorithm"])
    if algorithm not in RELEASES:
        raise protocol.ProtocolError(f"unknown algorithm {algorithm!r}")
    kind = RELEASES[algorithm]
    key = entry(str(request.config["run-key"]), algorithm, int(request.config["step"]))
    event = kind.cost(request)
    ordinal = book(policy, str(node.client), key, (event,), policy.budget)  # before the data is read
    rng = None if policy.randomness is Randomness.SECURE else np.random.default_rng([policy.seed or 0, ordinal])
    values, spent = kind.compute(request, node, rng)
    assert spent == event, "the release spent another event than was booked"
    return RecordDict({VALUES: ArrayRecord({VALUES: Array(np.asarray(values, float))}),
                       protocol.PRIVACY: protocol.events_record(key, (event,))})


@app.query()
def query(msg: Message, context: Context) -> Message:
    """One noisy release of this node's statistic; or a refusal saying why."""
    return answer(release, msg, context)
