"""A curious server asks a node for DP-SGD at a sampling rate its Poisson sampler cannot draw
(q = 1e-12: booked as ε ≈ 0, while a float32 sampler keeps each record with probability
2⁻²⁴ and 20,000 steps cost ε ≈ 12): every node refuses before booking or reading data."""

import numpy as np
import pytest

from clients.classic.client_app import app
from fedpriv.algorithms import iris
from fedpriv.privacy.events import LaplaceEvent
from server.classic.loops import Shares, _ask
from tests.flower.inprocess import InProcessGrid, booked, node_config

pytestmark = pytest.mark.usefixtures("task_identity")


def test_a_training_request_at_an_unrepresentable_sample_rate_is_refused_before_booking(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr("clients.classic.algorithms.load", lambda *args: read.append(args))
    nodes = {i: node_config(i, 2, tmp_path, **{"epsilon-budget": 100.0, "randomness": "seeded", "seed": 1})
             for i in range(2)}
    grid = InProcessGrid({}, nodes, client_app=app)
    config = {"algorithm": "ann-iris", "dataset": "iris", "seed": 0, "run-key": "run-" + "ab" * 6, "step": 0,
              "noise-multiplier": 1.0, "sample-rate": 1e-12, "steps": 20_000, "max-grad-norm": 1.0, "lr": 0.1,
              "lot-size": 1.0}
    shares = Shares()
    _, accepted = _ask(grid, config, {"weights": np.zeros(iris.NUM_PARAMETERS)}, 1, LaplaceEvent(1.0), shares)
    assert accepted == 0 and len(shares.refused) == 2
    assert read == [] and not any(booked(tmp_path / f"node{i}") for i in range(2))
