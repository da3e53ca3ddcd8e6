"""ClientApp of the classic algorithms: a node releases its share of a sufficient statistic
(the functional mechanism's coefficient sums, DPLloyd's per-cluster counts and sums),
with Laplace noise, under its own policy and durable ledger.

Everything in the message is the server's and untrusted: the bounds and ε only set how
much noise a release gets for the sensitivity they imply, and the node books the cost in
its ledger *before* it touches its data, refusing what its budget does not allow (the same
``book`` as DP-SGD training). Noise comes from the OS CSPRNG unless the node's policy says
``seeded``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import answer
from clients.releases import book
from fedpriv.algorithms import kmeans, linreg
from fedpriv.algorithms.datasets import client_share, load
from fedpriv.federation import protocol
from fedpriv.federation.policy import Randomness, load_policy

CONFIG, ARRAYS, VALUES = "config", "arrays", "values"
ALGORITHMS = ("linreg", "kmeans-dplloyd")

app = ClientApp()


def entry(run_key: str, algorithm: str, step: int) -> str:
    """The ledger entry of one release: a node never answers one twice."""
    return f"{protocol.check_run_key(run_key)}/{algorithm}/step-{step}"


def _array(arrays: ArrayRecord, name: str) -> np.ndarray:
    if name not in arrays:
        raise protocol.ProtocolError(f"message lacks array {name!r}")
    value = arrays[name].numpy().astype(float)
    if not np.all(np.isfinite(value)):
        raise protocol.ProtocolError(f"array {name!r} is not finite")
    return value


def release(msg: Message, context: Context) -> RecordDict:
    """Book, then compute and noise this node's statistic for the requested step."""
    policy = load_policy(context.node_config)
    client, clients = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    config, arrays = msg.content.config_records[CONFIG], msg.content.array_records[ARRAYS]
    algorithm, epsilon = str(config["algorithm"]), float(config["epsilon"])
    if algorithm not in ALGORITHMS:
        raise protocol.ProtocolError(f"unknown algorithm {algorithm!r}")
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise protocol.ProtocolError(f"bad epsilon {epsilon!r}")
    key = entry(str(config["run-key"]), algorithm, int(config["step"]))
    seed = int(config["seed"])
    if algorithm == "linreg":
        target = _array(arrays, "target")
        bounds = linreg.Bounds(_array(arrays, "low"), _array(arrays, "high"), (float(target[0]), float(target[1])))
        share = float(config["quadratic-share"])
        event = linreg.release_event(len(bounds.low), epsilon, share)
    else:
        box, centroids = kmeans.Box(_array(arrays, "low"), _array(arrays, "high")), _array(arrays, "centroids")
        event = kmeans.release_event(len(centroids), box, epsilon)
    ordinal = book(policy, str(client), key, (event,), policy.budget)  # before the data is read
    rng = None if policy.randomness is Randomness.SECURE else np.random.default_rng([policy.seed or 0, ordinal])
    x_train, y_train, _, _ = load(str(config["dataset"]), seed)
    x, y = client_share(x_train, y_train, client, clients, seed)
    if algorithm == "linreg":
        noisy, spent = linreg.privatise(linreg.coefficients(x, y, bounds), len(bounds.low), epsilon, share, rng)
        values = np.concatenate([noisy.quadratic, noisy.linear])
    else:
        out = kmeans.noisy_sums(x, centroids, box, epsilon, rng)
        values, spent = out.values.ravel(), out.event
    assert spent == event, "the release spent another event than was booked"
    return RecordDict({VALUES: ArrayRecord({VALUES: Array(values)}),
                       protocol.PRIVACY: protocol.events_record(key, (event,))})


@app.query()
def query(msg: Message, context: Context) -> Message:
    """One noisy release of this node's statistic; or a refusal saying why."""
    return answer(release, msg, context)
