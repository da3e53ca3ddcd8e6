"""Seeded node randomness never runs silently: each process in which a node acts under a
seeded policy (``fedpriv.node.checked_policy``, every handler's first step) prints one
warning naming the risk, a secure one prints none, and the simulation's
``results.json`` and ε summary say which randomness the nodes used."""

import json
import subprocess
import sys

import pytest

from fedpriv.project import PROJECT_ROOT
from server.history import epsilon_summary
from tests.timeouts import scaled

WARNING = "fedpriv warning: node randomness = seeded"


def _stderr_of(program: str) -> str:
    done = subprocess.run([sys.executable, "-c", program], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


@pytest.mark.parametrize("randomness", ["seeded", "secure"])
def test_a_seeded_policy_warns_once_per_process_and_a_secure_one_never(tmp_path, randomness):
    seed = ', "seed": 3' if randomness == "seeded" else ""
    stderr = _stderr_of(
        "from fedpriv.node import checked_policy\n"
        "from fedpriv.privacy import LedgerError\n"
        f"config = {{'epsilon-budget': 1.0, 'state-dir': {str(tmp_path)!r}, 'randomness': {randomness!r}{seed}}}\n"
        "for pid in range(3):\n"
        "    try:\n"
        "        checked_policy({**config, 'partition-id': pid})\n"
        "    except LedgerError:\n"
        "        pass  # never initialised: refused after the warning\n")
    lines = [line for line in stderr.splitlines() if line.startswith("fedpriv warning")]
    if randomness == "secure":
        assert lines == []
        return
    (line,) = lines  # three nodes' policies loaded, one warning
    assert line.startswith(WARNING)
    assert "whoever knows the seed can regenerate the DP noise" in line and "floating-point" in line


def test_the_epsilon_summary_names_the_randomness_where_known():
    assert epsilon_summary([1.0, 2.0], "seeded").endswith("(node randomness: seeded)")
    assert "randomness" not in epsilon_summary([1.0, 2.0])


@pytest.mark.slow
@pytest.mark.cluster
def test_a_simulation_warns_and_records_seeded_randomness(tmp_path, shared_data_dir):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "simulations.mnist", "--clients", "1", "--rounds", "1", "--noise-multiplier", "1.0",
         "--limit-train", "64", "--limit-test", "64", "--data-dir", str(shared_data_dir), "--out", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=scaled(600))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    driver = [line for line in done.stderr.splitlines() if line.startswith(WARNING)]
    assert len(driver) == 1  # the command's own process; node processes' lines carry Ray's prefix
    assert json.loads((out / "results.json").read_text())["randomness"] == "seeded"
    assert "(node randomness: seeded)" in done.stdout


def test_a_nodes_ledger_says_which_randomness_its_epsilon_rests_on(tmp_path, capsys):
    """``ledger show`` reports the node's randomness; once any release was seeded, the
    ledger says so for good (its ε then rests partly on seeded noise)."""
    import math

    from clients.releases import book
    from fedpriv.federation.policy import load_policy
    from fedpriv.privacy import Budget, GaussianEvent
    from fedpriv.privacy.__main__ import main as privacy_command
    from fedpriv.privacy.charge import Charge
    from tests.flower.inprocess import initialised

    shown = []
    for i, policy in enumerate([{"randomness": "secure"}, {"randomness": "seeded", "seed": 3},
                                {"randomness": "secure"}]):
        config = initialised({"partition-id": 0, "num-partitions": 1, "state-dir": str(tmp_path / "node"),
                              "epsilon-budget": math.inf, **policy})
        book(load_policy(config, environ={}), "0", Charge(f"release-{i}", (GaussianEvent(5.0),)),
             Budget(math.inf, 1e-5))
        assert privacy_command(["ledger", "show", str(tmp_path / "node" / "ledger.json")]) == 0
        shown.append(capsys.readouterr().out.splitlines()[0])
    assert [line.rsplit("node randomness ", 1)[-1] for line in shown] == ["secure)", "seeded)", "seeded)"]
