"""Seed paper 002's classifiers on iris: the DP-SGD ANN's cross-validation spends ε in all
(dp-accounting's RDP as the reference), and output perturbation's sensitivity, noise scale
and per-answer budget."""

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats
from sklearn.datasets import load_iris

from fedpriv.algorithms import iris
from fedpriv.privacy import Budget, BudgetExceededError, PrivacyLedger
from fedpriv.privacy.events import to_dp_accounting

X, Y = load_iris(return_X_y=True)


def test_cross_validation_spends_epsilon_in_all_and_learns_at_a_large_epsilon():
    accuracy, events = iris.cross_validate(X, Y, 2.0, 1e-5)
    accountant = dp_accounting.rdp.RdpAccountant()
    for event in events:
        accountant.compose(to_dp_accounting(event))
    assert len(events) == iris.FOLDS and 1.8 < accountant.get_epsilon(1e-5) <= 2.0 + 1e-9
    assert iris.cross_validate(X, Y, 100.0, 1e-5)[0] > 0.9


@settings(max_examples=200, deadline=None)
@given(a=arrays(float, 3, elements=st.floats(-50, 50)), b=arrays(float, 3, elements=st.floats(-50, 50)))
def test_any_two_softmax_answers_are_at_most_two_apart(a, b):
    p, q = torch.softmax(torch.tensor(a), 0), torch.softmax(torch.tensor(b), 0)
    assert float((p - q).abs().sum()) <= iris.SENSITIVITY + 1e-12


def test_the_reports_sensitivity_of_one_is_too_small():
    confident = [torch.softmax(torch.tensor(v), 0) for v in ([60.0, 0.0, 0.0], [0.0, 60.0, 0.0])]
    assert float((confident[0] - confident[1]).abs().sum()) > 1.99


def test_answers_carry_laplace_noise_of_scale_two_over_epsilon():
    model = iris.train_nonprivate(X, Y, epochs=50)
    ledger = PrivacyLedger(Budget(epsilon=1e9, delta=1e-5), accountant="basic")
    answers = iris.PerturbedOutputs(model, 0.5, ledger, rng=np.random.default_rng(0))
    record = X[0]
    with torch.no_grad():
        exact = torch.softmax(model(iris.scale(record[None, :])), 1).numpy()[0]
    noise = np.concatenate([answers.answer(record) - exact for _ in range(1500)])
    assert stats.kstest(noise, stats.laplace(scale=4.0).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue < 1e-3  # the report's sensitivity 1


def test_every_answer_is_booked_and_answering_stops_at_the_budget():
    calls = []
    model = iris.network(0)
    model.register_forward_hook(lambda *args: calls.append(1))
    ledger = PrivacyLedger(Budget(epsilon=3.0, delta=1e-5), accountant="basic")  # 3 answers at ε = 1: 3, no more
    answers = iris.PerturbedOutputs(model, 1.0, ledger, rng=np.random.default_rng(0))
    for record in X[:3]:
        answers.answer(record)
    with pytest.raises(BudgetExceededError):
        answers.answer(X[3])
    assert len(calls) == 3 and len(ledger.entries("0")) == 3
    assert ledger.spent("0") == pytest.approx(3.0, rel=1e-6)
