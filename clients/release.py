"""The one path of every release a node makes, in both apps: parse and check, book, compute.

A ``ReleaseKind`` is one kind of request a node answers (a DP-SGD round, a noisy
evaluation, a secure sum's vector, a classic algorithm's statistic):

- ``parse(...) -> (request, Charge)`` reads the message (untrusted: every value it will use
  is checked), the node's policy, its released N and its data folder, and raises on
  anything the node will not release: ``Refusal``, ``ProtocolError`` or another
  ``ValueError``/``KeyError``/``TypeError``, which ``clients.client_app.answer`` sends as one
  refusal. Nothing is booked yet. The request names its ``Account``: whose ledger, which
  client, within which budget; δ is checked against N when the account is made.
- ``compute(request, Booked) -> content`` runs once the charge is booked (``Booked.ordinal``
  seeds a seeded node's streams), under ``clients.failures.after_booking``: any failure
  leaves as a fixed text only.

``release`` is that path; ``reply`` adds the charge to a reply's content, as the server
expects it (``protocol.charge_record``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, ParamSpec, Protocol, TypeVar

from flwr.app import RecordDict

from clients.delta import check_delta
from clients.failures import after_booking
from clients.releases import book
from fedpriv.federation import protocol
from fedpriv.federation.policy import NodePolicy
from fedpriv.privacy import Budget
from fedpriv.privacy.charge import Charge


@dataclass(frozen=True)
class Account:
    """Where a release is booked: the node's ledger (its ``policy``'s), under ``client``,
    within ``budget``. Made by ``account``, which checks δ first."""

    policy: NodePolicy
    client: str
    budget: Budget


def account(policy: NodePolicy, client: str, budget: Budget, num_examples: int) -> Account:
    """The account of a release protecting ``num_examples`` records (a public or already
    released N: the check is post-processing); ``Refusal`` where δ is too large for it."""
    check_delta(budget.delta, num_examples)
    return Account(policy, client, budget)


class Request(Protocol):
    """A parsed request: whatever its kind computes from, and the account it is booked to."""

    @property
    def account(self) -> Account: ...


@dataclass(frozen=True)
class Booked:
    """A booked charge and its ordinal (how many entries the client had before)."""

    charge: Charge
    ordinal: int


Inputs = ParamSpec("Inputs")
R = TypeVar("R", bound=Request)
C = TypeVar("C")


@dataclass(frozen=True)
class ReleaseKind(Generic[Inputs, R, C]):
    """One kind of release: ``parse`` (every check, nothing booked) and ``compute`` (after booking)."""

    parse: Callable[Inputs, tuple[R, Charge]]
    compute: Callable[[R, Booked], C]


def release(kind: ReleaseKind[Inputs, R, C], *args: Inputs.args, **kwargs: Inputs.kwargs) -> tuple[C, Charge]:
    """Parse the request (refusals here, before anything is booked), book its charge in the
    node's durable ledger, then compute what is released; returns it with the charge."""
    request, charge = kind.parse(*args, **kwargs)
    where = request.account
    ordinal = book(where.policy, where.client, charge, where.budget)
    with after_booking(charge.entry):
        content = kind.compute(request, Booked(charge, ordinal))
    return content, charge


def reply(kind: ReleaseKind[Inputs, R, RecordDict], *args: Inputs.args, **kwargs: Inputs.kwargs) -> RecordDict:
    """``release``'s content with its charge record (``protocol.PRIVACY``) added."""
    content, charge = release(kind, *args, **kwargs)
    content[protocol.PRIVACY] = protocol.charge_record(charge)
    return content
