"""ClientApp of the classic algorithms: a node answers a request with one noisy release
(the functional mechanism's coefficient sums, DPLloyd's per-cluster counts and sums, ...)
under its own policy and durable ledger.

Each algorithm is an ``Algorithm`` in ``clients.classic.algorithms.RELEASES``: ``parse``
reads the request once and checks every value the release will use, against the data set's
public shape too (its number of features, the size of the node's share: never its records),
and returns the parsed values with the event the release costs; ``compute`` uses only those
values. The message is the server's and untrusted: its numbers only set how much noise a release gets
for the sensitivity they imply. Every release takes the node's one release path
(``clients.release``, the DP-SGD app's too, kind ``RELEASE``): a malformed request is
refused before anything is booked; then the node books the cost in its ledger *before* it
touches its data, refusing what its budget does not allow. The release must spend exactly
the booked event, and a failure after booking leaves as a fixed text only. Noise comes from
the OS CSPRNG unless the node's policy says ``seeded``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.classic.algorithms import Algorithm, Node, parse
from clients.client_app import answer
from clients.release import Account, Booked, ReleaseKind, account, reply
from fedpriv.federation.classic_protocol import ARRAYS, CONFIG, VALUES, Request
from fedpriv.federation.policy import Randomness
from fedpriv.node import checked_policy
from fedpriv.privacy.charge import Charge
from fedpriv.seeding import derive_seed

app = ClientApp()


@dataclass(frozen=True)
class Classic:
    """A classic request as parsed: the node's account, its share, the algorithm and its values."""

    account: Account
    node: Node
    algorithm: Algorithm[Any]
    params: Any


def parse_release(msg: Message, context: Context) -> tuple[Classic, Charge]:
    """The request's algorithm and values, checked from the request and the public shape of
    the node's share (δ against its size, public: no record read), and the node's data files."""
    policy = checked_policy(context.node_config)
    node = Node(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]), policy.data_dir)
    request = Request(msg.content.config_records[CONFIG], msg.content.array_records[ARRAYS])
    algorithm, params, event = parse(request)
    charge = Charge(request.entry, (event,))
    where = account(policy, str(node.client), policy.budget, params.share.size(node))
    if algorithm.ready is not None:
        algorithm.ready(node)
    return Classic(where, node, algorithm, params), charge


def compute_release(request: Classic, booked: Booked) -> RecordDict:
    """Compute and noise this node's statistic; it must spend exactly the booked event."""
    policy, node = request.account.policy, request.node
    # seeded (simulations): a stream per node and per entry, so two nodes given one seed never draw the same noise
    rng = (None if policy.randomness is Randomness.SECURE
           else np.random.default_rng(derive_seed(policy.seed or 0, "release", node.client, booked.ordinal)))
    values, spent = request.algorithm.compute(request.params, node, rng)
    booked.charge.require_same((spent,), "the release")  # a bug of the algorithm, not bad input: nothing leaves
    return RecordDict({VALUES: ArrayRecord({VALUES: Array(np.asarray(values, float))})})


RELEASE = ReleaseKind(parse_release, compute_release)


def release(msg: Message, context: Context) -> RecordDict:
    """Parse, book, then compute and noise this node's statistic for the requested step."""
    return reply(RELEASE, msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """One noisy release of this node's statistic; or a refusal saying why."""
    return answer(release, msg, context)
