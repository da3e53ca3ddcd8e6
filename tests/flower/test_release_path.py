"""The node's one release path (``clients.release``), played by a kind that misbehaves: a
refusal in parse books nothing; a failure in compute is booked and leaves as the fixed text
only; an entry is never computed twice; δ ≥ 1/N is refused before booking."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clients.failures import ReleaseFailed
from clients.release import Account, Booked, ReleaseKind, account, release
from clients.releases import Refusal
from fedpriv.federation import protocol
from fedpriv.federation.policy import NodePolicy, load_policy
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import GaussianEvent
from tests.flower.inprocess import booked, node_config

EVENT = GaussianEvent(4.0)


@dataclass(frozen=True)
class Request:
    account: Account
    value: int


def _policy(tmp_path) -> NodePolicy:
    return load_policy(node_config(0, 1, tmp_path, **{"epsilon-budget": 10.0}), environ={})


def _kind(policy: NodePolicy, computed: list[int], *, refuse: bool = False, fail: bool = False):
    def parse(value: int) -> tuple[Request, Charge]:
        if refuse:
            raise protocol.ProtocolError(f"value {value} refused")
        return Request(account(policy, "0", policy.budget, 1000), value), Charge(f"run/{value}", (EVENT,))

    def compute(request: Request, booked_as: Booked) -> int:
        computed.append(request.value)
        if fail:
            raise RuntimeError(f"a batch of {request.value} secret records")  # its text must not leave
        return request.value * 2

    return ReleaseKind(parse, compute)


def test_a_release_is_booked_once_then_computed(tmp_path):
    policy, computed = _policy(tmp_path), []
    content, charge = release(_kind(policy, computed), 7)
    assert (content, charge) == (14, Charge("run/7", (EVENT,))) and computed == [7]
    assert booked(tmp_path / "node0") == {"0": {"run/7": (EVENT,)}}
    with pytest.raises(Refusal, match="already ran run/7"):
        release(_kind(policy, computed), 7)
    assert computed == [7]  # a replayed entry is never computed again


def test_a_refusal_in_parse_books_nothing(tmp_path):
    policy, computed = _policy(tmp_path), []
    with pytest.raises(protocol.ProtocolError, match="value 7 refused"):
        release(_kind(policy, computed, refuse=True), 7)
    assert booked(tmp_path / "node0") == {} and computed == []


def test_a_failure_after_booking_leaves_as_the_fixed_text(tmp_path):
    policy, computed = _policy(tmp_path), []
    with pytest.raises(ReleaseFailed) as failed:
        release(_kind(policy, computed, fail=True), 7)
    assert str(failed.value) == protocol.FAILED_AFTER_BOOKING and failed.value.__cause__ is None
    assert booked(tmp_path / "node0") == {"0": {"run/7": (EVENT,)}}  # booked: a crash can only over-charge


def test_delta_too_large_for_n_is_refused_when_the_account_is_made(tmp_path):
    policy = _policy(tmp_path)
    with pytest.raises(Refusal, match="too large"):
        account(policy, "0", policy.budget, round(1 / policy.budget.delta))  # δ = 1/N
