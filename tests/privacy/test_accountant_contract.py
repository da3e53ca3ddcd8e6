"""One contract for every accountant backend (validate-then-mutate, ε/δ consistency)."""

import math

import dp_accounting
import pytest

from fedpriv.privacy import (
    AccountantKind,
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    UnsupportedEventError,
    dpsgd_event,
    make_accountant,
)

EVENT = ComposedEvent((LaplaceEvent(4.0), dpsgd_event(2.0, 0.05, 50)))
# Poisson sampling of a composition containing Laplace: no backend supports it.
UNSUPPORTED = ComposedEvent((GaussianEvent(1.0), PoissonSampledEvent(0.1, ComposedEvent((LaplaceEvent(1.0),)))))


@pytest.fixture(params=list(AccountantKind), ids=lambda k: k.value)
def kind(request):
    return request.param


def test_kind_accepts_strings_and_rejects_unknown():
    assert make_accountant("pld").kind is AccountantKind.PLD
    with pytest.raises(ValueError, match="choose one of"):
        make_accountant("moments")


def test_empty_accountant_is_free(kind):
    acc = make_accountant(kind)
    assert acc.epsilon(1e-5) == 0
    assert acc.delta(1.0) == 0


def test_delta_inverts_epsilon(kind):
    acc = make_accountant(kind).compose(EVENT)
    eps = acc.epsilon(1e-5)
    assert 0 < eps < math.inf
    assert acc.delta(eps) == pytest.approx(1e-5, rel=1e-3)


def test_monotone(kind):
    acc = make_accountant(kind).compose(EVENT)
    assert acc.epsilon(1e-7) >= acc.epsilon(1e-5) >= acc.epsilon(1e-3)
    assert acc.delta(1.0) >= acc.delta(2.0)
    before = acc.epsilon(1e-5)
    assert acc.compose(EVENT).epsilon(1e-5) > before


@pytest.mark.parametrize("bad", [UNSUPPORTED, "not an event", dp_accounting.GaussianDpEvent(1.0)],
                         ids=["nested", "str", "dpa"])
def test_unsupported_event_leaves_state_untouched(kind, bad):
    acc = make_accountant(kind).compose(EVENT)
    before = acc.epsilon(1e-5)
    with pytest.raises(UnsupportedEventError):
        acc.compose(bad)
    assert acc.epsilon(1e-5) == before


def test_invalid_arguments(kind):
    acc = make_accountant(kind)
    for delta in (0, 1, -0.1, 2):
        with pytest.raises(ValueError, match="delta"):
            acc.epsilon(delta)
    with pytest.raises(ValueError, match="epsilon"):
        acc.delta(-1.0)


def test_non_private_release_is_infinite(kind):
    acc = make_accountant(kind).compose(GaussianEvent(0.0))
    assert acc.epsilon(1e-5) == math.inf
    assert acc.delta(10.0) == 1


def test_heterogeneous_composition(kind):
    parts = [make_accountant(kind).compose(e).epsilon(1e-5) for e in EVENT.events]
    total = make_accountant(kind).compose(EVENT).epsilon(1e-5)
    assert max(parts) < total < math.inf
