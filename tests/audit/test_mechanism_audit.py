"""Black-box audits of every releasing mechanism: a correct run's bound stays at or below its
claim, a run with a fraction of the noise is flagged, and a node's releases are audited
without writing anything where a node keeps its state."""

from pathlib import Path

import numpy as np
import pytest

from fedpriv.audit import mechanism_cases
from fedpriv.audit.mechanism_cases import CASES
from fedpriv.audit.mechanisms import audit_mechanism
from simulations.audit import MECHANISMS

TRIALS = 1000


def test_the_command_offers_every_mechanism():
    assert MECHANISMS == tuple(CASES)


@pytest.mark.parametrize("name", CASES)
def test_a_correct_mechanism_stays_below_its_claim(name):
    result = audit_mechanism(name, 1.0, trials=TRIALS, seed=1)
    assert 0.95 <= result["claimed_epsilon"] <= 1.05
    assert result["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert not result["flagged"]


@pytest.mark.parametrize("name", CASES)
def test_a_mechanism_with_a_quarter_of_its_noise_is_flagged(name):
    # a quarter at this small n (half at the command's default n: docs/audit.md)
    result = audit_mechanism(name, 1.0, trials=TRIALS, seed=2, noise_factor=0.25)
    assert result["flagged"] and result["epsilon_lower_bound"] > result["claimed_epsilon"]


def test_half_noise_laplace_is_flagged_at_small_n():
    assert audit_mechanism("laplace", 1.0, trials=TRIALS, seed=3, noise_factor=0.5)["flagged"]


@pytest.mark.parametrize("name", ["count", "evaluation"])
def test_node_releases_are_audited_on_their_own_copies(name, monkeypatch, tmp_path):
    folders = []
    real = mechanism_cases._on_own_copy

    def spy(release):
        def recorded(folder: Path):
            folders.append(folder)
            return release(folder)
        return real(recorded)

    monkeypatch.setattr(mechanism_cases, "_on_own_copy", spy)
    audit_mechanism(name, 1.0, trials=20)
    assert folders and all(not f.exists() for f in folders)  # temporary, removed, and checked empty before

    def writes(folder: Path) -> np.ndarray:
        (folder / "ledger.json").write_text("{}")
        return np.zeros(1)

    with pytest.raises(RuntimeError, match="wrote into its state folder"):
        real(writes)
