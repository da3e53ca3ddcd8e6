"""Settings that cannot work, or cannot learn, say so before anything is spent: the privacy
CLI's unreachable ε and a fixed σ affording no round are one line and exit 2; a federated
run whose noise buries every update, or a distributed run (one DP-SGD step per round),
prints a warning or a note before training; a small ε is never printed as zero."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import GaussianEvent, dpsgd_event, epsilon_of
from fedpriv.privacy.__main__ import main
from fedpriv.project import PROJECT_ROOT
from server.history import epsilon_summary, epsilon_text
from simulations._advice import before_training
from simulations._federated import share_sizes

PLAN = ["plan", "--population", "10", "--rounds", "5", "--records-per-client", "600", "--delta", "1e-5"]


def _one_line_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    assert exit_info.value.code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("python -m fedpriv.privacy") and ": error: " in out.err
    return out.err


def test_sigma_for_an_unreachable_epsilon_is_one_line_without_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "fedpriv.privacy", "sigma", "--epsilon", "0.00001",
                           "--sample-rate", "1", "--steps", "1000", "--delta", "1e-5"],
                          capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "reaches epsilon 1e-05" in done.stderr


def test_a_fixed_sigma_that_affords_no_round_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # one round of σ = 0.5 at q = 256/600 costs ε ≈ 10 (dp-accounting's RDP, not the planner's)
    first_round = epsilon_of(dpsgd_event(0.5, 256 / 600, 3), 1e-5)
    assert first_round > 1
    err = _one_line_exit_2([*PLAN, "--privacy", "local", "--noise-multiplier", "0.5", "--target-epsilon", "1"],
                           capsys)
    assert "noise multiplier 0.5 affords no round within target epsilon 1" in err and "--noise-multiplier" in err


def test_a_mode_that_affords_no_round_beside_one_that_does_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    # at σ = z = 3: local (q ≈ 0.68) spends ε ≈ 1.09 a round, user level (everyone every round) ≈ 1.39
    assert main([*PLAN, "--privacy", "local", "--privacy", "user", "--noise-multiplier", "3",
                 "--target-epsilon", "1.2"]) == 0
    out = capsys.readouterr()
    assert out.err.count("\n") == 1
    assert "warning: noise multiplier 3 affords no round within target epsilon 1.2" in out.err
    assert "user: epsilon" in out.err and "local:" not in out.err
    assert out.out.splitlines()[0].split() == ["local", "user"]


def test_the_plan_says_what_its_rows_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--target-epsilon", "2"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if ":" in line and "  " not in line]
    assert any(line.startswith("noise-to-signal: the std of the noise") for line in notes)
    assert any(line.startswith("distributed takes one DP-SGD step per round") and "rounds planned" in line
               for line in notes)


def test_the_simulations_warn_before_training_when_noise_buries_the_updates(shared_data_dir) -> None:
    def advice(node_budget: float | None = None, **run_config: object) -> list[str]:
        settings = RunSettings.from_run_config({"data-dir": str(shared_data_dir), "limit-train": 3000,
                                                "lot-size": 256, "rounds": 5, **run_config})
        return before_training(settings, 3, share_sizes(settings, 3, 0), node_budget)

    (warning,) = advice(**{"target-epsilon": 0.00001})
    assert warning.startswith("warning: the noise will bury every update") and "--target-epsilon" in warning
    assert advice(**{"target-epsilon": 2}) == []
    distributed = advice(privacy="distributed", rounds=1)
    assert distributed[0].startswith("note: distributed mode takes one DP-SGD step per round")
    assert "--rounds 1 trains 1 step " in distributed[0]


def test_a_small_epsilon_is_never_printed_as_zero() -> None:
    assert epsilon_text(1.99612) == "1.9961" and epsilon_text(0) == "0.0000"
    assert epsilon_text(8.73e-6) == "8.73e-06" and float(epsilon_text(0.0123456)) == pytest.approx(0.01235)
    assert "0.0000" not in epsilon_summary([1e-5, 2e-5, 3e-5])


def test_a_user_level_run_whose_nodes_cannot_afford_one_round_is_refused(shared_data_dir) -> None:
    """Central user level books Gaussian(z/2) in a node's ledger per round it takes part in; at
    z ≈ 1 for ε = 5 over 30 rounds, one such round costs a node ε ≈ 12 (dp-accounting's
    Gaussian), so a node budget of 5 (the default: --target-epsilon) refuses everything."""
    settings = RunSettings.from_run_config({"data-dir": str(shared_data_dir), "limit-train": 3000, "rounds": 30,
                                            "privacy": "user", "cohort": 10, "target-epsilon": 5})
    sizes = share_sizes(settings, 100, 0)
    with pytest.raises(ValueError, match="--client-epsilon-budget: every simulated node would refuse"):
        before_training(settings, 100, sizes, node_budget=5)
    assert epsilon_of(GaussianEvent(0.5), 1e-5) > 5  # z ≤ 1 here, a round costs at least this
    assert before_training(settings, 100, sizes, node_budget=100) == []
