"""``python -m fedpriv.privacy``: JSON on stdout, one-line errors with exit status 2.

Subprocesses check the real entry point (stdout clean, no traceback); the table of
invalid inputs runs ``main`` in-process because each interpreter start costs seconds.
"""

import json
import subprocess
import sys

import pytest

from fedpriv.privacy import Budget, GaussianEvent, PrivacyLedger, dpsgd_event
from fedpriv.privacy.__main__ import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "fedpriv.privacy", *args], capture_output=True, text=True)


COMMON = ["--sample-rate", "0.01", "--steps", "6000", "--delta", "1e-5"]


def test_epsilon_and_sigma_json():
    out = run("epsilon", "--accountant", "rdp", "--noise-multiplier", "1.1", *COMMON)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data) == ["accountant", "epsilon", "delta", "sample_rate", "noise_multiplier", "steps"]
    assert data["epsilon"] == pytest.approx(4.25, abs=0.01) and data["steps"] == 6000
    bad = run("epsilon", "--noise-multiplier", "-1", *COMMON)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_sigma_json(capsys):
    assert main(["sigma", "--accountant", "zcdp", "--epsilon", "2", *COMMON]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["accountant"] == "zcdp" and data["achieved_epsilon"] <= 2 and data["noise_multiplier"] > 0
    assert {"epsilon", "delta", "sample_rate", "steps"} <= set(data)


def test_ledger_show(tmp_path, capsys):
    ledger = PrivacyLedger(Budget(8.0, 1e-5), "rdp")
    ledger.record("alice", "run-1/round-1/train", dpsgd_event(1.1, 0.01, 100))
    ledger.record("alice", "release/num-examples/ab12", [GaussianEvent(50.0), GaussianEvent(60.0)])
    ledger.save(tmp_path / "l.json")
    assert main(["ledger", "show", str(tmp_path / "l.json")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:3] == ["client", "entries", "events"] and "remaining" in table[1]
    assert table[2].split()[:3] == ["alice", "2", "3"]
    assert main(["ledger", "show", str(tmp_path / "l.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = data["clients"][0]
    assert row["client"] == "alice" and row["entries"] == 2 and row["events"] == 3 and "rounds" not in row
    assert row["epsilon_spent"] == ledger.spent("alice")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["epsilon", "--noise-multiplier", "0", *COMMON], "0"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "1", "--delta", "1e-5"], "1.5"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "1", "--delta", "1"], "delta"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "-3", "--delta", "1e-5"], "-3"),
        (["sigma", "--epsilon", "-1", *COMMON], "-1"),
        (["epsilon", "--accountant", "moments", "--noise-multiplier", "1", *COMMON], "moments"),
        (["ledger", "show", "/nonexistent/ledger.json"], "/nonexistent/ledger.json"),
    ],
)
def test_invalid_input_is_one_line_exit_2(args, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    assert exit_info.value.code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and needle in out.err


def test_corrupt_ledger_file(tmp_path):
    (tmp_path / "bad.json").write_text("{oops")
    out = run("ledger", "show", str(tmp_path / "bad.json"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "epsilon" in capsys.readouterr().out
