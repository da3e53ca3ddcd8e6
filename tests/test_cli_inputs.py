"""Every ``python -m simulations.*`` / ``benchmarks.*`` command refuses a bad input before it
starts Ray or loads data: one ``prog: error: ...`` line on stderr naming the flag, exit
status 2, no traceback, and little work: the command's own CPU time (its ``rusage``, which
a busy machine does not inflate the way it does wall time) stays far below what starting
Ray or loading and transforming MNIST costs.

The commands run as real subprocesses from a thread pool; most stop in argparse before
torch is imported, the rest in the settings or data check.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedpriv.data import DatasetNotFoundError, check_available
from fedpriv.project import run_config_defaults
from simulations._cli import (
    CACHE_ENV,
    at_least,
    federated_parser,
    flag_message,
    probability,
    use_cache_dir,
)
from tests.cifar_files import write_cifar10
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]
# CPU seconds of the command itself, generous bounds: a flag refused by its argparse type
# costs no torch import (0.1 s); the settings and data checks import torch, Flower and the
# data loaders first (about 5 s). Loading MNIST and its scattering features costs minutes.
MAX_SECONDS = {"argparse": 5.0, "checked": 25.0}
NO_NETWORK = {name: "http://127.0.0.1:9" for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}


@dataclass(frozen=True)
class Case:
    module: str
    argv: tuple[str, ...]
    flag: str  # what the error line must name
    stage: str = "argparse"  # "checked": refused after argparse, by the settings or data check
    env: tuple[tuple[str, str], ...] = ()


# {empty} is a folder without any data set in it; {held} holds an earlier run's results.json.
CASES = {
    # refused after argparse (first, so that the slow ones start first)
    "mnist-resume-without-state-dir": Case("simulations.mnist", ("--resume",), "--resume", "checked"),
    "mnist-resume-nothing-there": Case("simulations.mnist", ("--resume", "--state-dir", "{empty}"), "--resume",
                                       "checked"),
    "mnist-unknown-model": Case("simulations.mnist", ("--model", "resnet"), "--model"),
    "mnist-missing-data": Case("simulations.mnist", ("--data-dir", "{empty}"), "--data-dir", "checked"),
    "mnist-download-fails": Case("simulations.mnist", ("--data-dir", "{empty}/new", "--download"), "--download",
                                 "checked", tuple(NO_NETWORK.items())),
    "centralized-missing-data": Case("simulations.centralized", ("--data-dir", "{empty}"), "--data-dir", "checked"),
    "benchmark-simulation-missing-data": Case("benchmarks.simulation", ("--data-dir", "{empty}"), "--data-dir",
                                              "checked"),
    "benchmark-dpsgd-threads-0": Case("benchmarks.dpsgd", ("--threads", "0", "--out", "{empty}/x.json"),
                                      "--threads", "checked"),  # its module imports torch first
    "benchmark-accountant-repeats-0": Case("benchmarks.accountant", ("--repeats", "0"), "--repeats", "checked"),
    "deployment-missing-data": Case("simulations.deployment", ("--nodes", "2", "--rounds", "1", "--out", "{empty}/d",
                                                               "--data-dir", "{empty}"), "--data-dir", "checked"),
    # refused by argparse, or by the cheap checks beside it (no torch imported)
    "mnist-out-holds-results": Case("simulations.mnist", ("--out", "{held}", "--data-dir", "{empty}/nowhere"),
                                    "--out"),
    "cifar-out-holds-results": Case("simulations.cifar", ("--out", "{held}"), "--out"),
    "mnist-data-dir-not-a-folder": Case("simulations.mnist", ("--out", "{empty}/run", "--data-dir", "{empty}/nowhere"),
                                        "--data-dir"),
    "mnist-target-epsilon-negative": Case("simulations.mnist", ("--target-epsilon", "-1"), "--target-epsilon"),
    "mnist-delta-2": Case("simulations.mnist", ("--delta", "2"), "--delta"),
    "mnist-rounds-0": Case("simulations.mnist", ("--rounds", "0"), "--rounds"),
    "mnist-fraction-train-0": Case("simulations.mnist", ("--fraction-train", "0"), "--fraction-train"),
    "mnist-clients-0": Case("simulations.mnist", ("--clients", "0"), "--clients"),
    "mnist-lot-size-0": Case("simulations.mnist", ("--lot-size", "0"), "--lot-size"),
    "mnist-cpus-per-client-0": Case("simulations.mnist", ("--cpus-per-client", "0"), "--cpus-per-client"),
    "mnist-gpus-per-client-negative": Case("simulations.mnist", ("--gpus-per-client", "-1"), "--gpus-per-client"),
    "mnist-num-examples-noise-0": Case("simulations.mnist", ("--num-examples-noise", "0"), "--num-examples-noise"),
    "mnist-client-epsilon-budget-0": Case("simulations.mnist", ("--client-epsilon-budget", "0"),
                                          "--client-epsilon-budget"),
    "mnist-epsilon-and-sigma": Case("simulations.mnist", ("--target-epsilon", "1", "--noise-multiplier", "1"),
                                    "--noise-multiplier"),
    "mnist-rounds-not-a-number": Case("simulations.mnist", ("--rounds", "two"), "--rounds"),
    "mnist-abbreviated-flag": Case("simulations.mnist", ("--round", "3"), "--round"),
    "cifar-limit-test-0": Case("simulations.cifar", ("--limit-test", "0"), "--limit-test"),
    "centralized-delta-2": Case("simulations.centralized", ("--delta", "2"), "--delta"),
    "centralized-lot-size-0": Case("simulations.centralized", ("--lot-size", "0"), "--lot-size"),
    "benchmark-simulation-clients-0": Case("benchmarks.simulation", ("--clients", "0"), "--clients"),
    "deployment-nodes-0": Case("simulations.deployment", ("--nodes", "0", "--rounds", "1", "--out", "{empty}/d"),
                               "--nodes"),
    "deployment-min-clients-over-nodes": Case("simulations.deployment", ("--nodes", "2", "--rounds", "1", "--out",
                                                                         "{empty}/d", "--min-clients", "3"),
                                              "--min-clients"),
    "classic-epsilon-0": Case("simulations.classic", ("linreg", "--epsilon", "0"), "--epsilon"),
    "classic-clients-input-perturbation": Case("simulations.classic", ("kmeans-input", "--epsilon", "1", "--clients",
                                                                       "2"), "--clients"),
    "benchmark-simulation-fraction-train": Case("benchmarks.simulation", ("--fraction-train", "1.5"),
                                                "--fraction-train"),
    "benchmark-simulation-larger-than-mnist": Case("benchmarks.simulation", ("--clients", "1000", "70000"),
                                                   "--clients"),
}


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    """CPU seconds (user + system) of the command's process."""


def _run(case: Case, empty: Path, held: Path) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **dict(case.env)}
    if case.env:  # no exceptions to the dead proxy
        for name in ("no_proxy", "NO_PROXY"):
            env.pop(name, None)
    argv = [arg.replace("{empty}", str(empty)).replace("{held}", str(held)) for arg in case.argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([sys.executable, "-m", case.module, *argv], cwd=ROOT, env=env,
                                   stdout=out, stderr=err, text=True)
        hang_guard = threading.Timer(scaled(600), process.kill)
        hang_guard.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage
        finally:
            hang_guard.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Outcome(process.returncode, out.read(), err.read(), usage.ru_utime + usage.ru_stime)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    empty = tmp_path_factory.mktemp("no-data")
    held = tmp_path_factory.mktemp("held")
    (held / "results.json").write_text("{}\n")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(_run, case, empty, held) for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_exit_2(name: str, outcomes: dict[str, Outcome]) -> None:
    case, outcome = CASES[name], outcomes[name]
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert outcome.returncode == 2, outcome.stderr[-3000:]
    assert "Traceback" not in outcome.stderr
    assert len(lines) == 1, outcome.stderr[-3000:]
    assert lines[0].startswith(f"python -m {case.module}: error: ")
    assert case.flag in lines[0]
    assert outcome.stdout == ""
    assert outcome.seconds < MAX_SECONDS[case.stage], f"{outcome.seconds:.1f} CPU s: did it start Ray or load data?"


def test_messages(outcomes: dict[str, Outcome]) -> None:
    """What the lines say, for the cases the issue names."""
    def line(name: str) -> str:
        return outcomes[name].stderr.strip()

    assert line("mnist-rounds-0").endswith("error: argument --rounds: must be >= 1, got 0")
    assert line("mnist-delta-2").endswith("error: argument --delta: must be in (0, 1), got 2")
    assert line("mnist-fraction-train-0").endswith("argument --fraction-train: must be in (0, 1], got 0")
    assert "--resume needs --state-dir" in line("mnist-resume-without-state-dir")
    assert "MNIST not found" in line("mnist-missing-data") and "--download" in line("mnist-missing-data")
    assert "already holds a run's results (results.json)" in line("mnist-out-holds-results")
    assert "no such folder" in line("mnist-data-dir-not-a-folder")
    download = line("mnist-download-fails")
    assert "downloading MNIST" in download and "failed" in download and "Connection refused" in download


def test_help_shows_the_run_defaults_of_pyproject() -> None:
    defaults = run_config_defaults()
    text = " ".join(federated_parser("mnist").format_help().split())
    for phrase in (f"federated rounds (default: {defaults['rounds']})",
                   f"local epochs per round (default: {defaults['local-epochs']})",
                   f"(default: {defaults['delta']})",
                   f"fraction of clients sampled per round (default: {defaults['fraction-train']})",
                   f"(default: {defaults['partition']})",
                   "simulated SuperNodes (default: 10)",
                   "one holding a run's results is refused unless resume (default: runs/mnist)",
                   "--cache-dir DIR cache of data-independent features (default: $FEDPRIV_CACHE_DIR or "
                   "~/.cache/fedpriv; 'off' disables it)"):
        assert phrase in text


def test_cache_dir_is_exported_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    parser = federated_parser("mnist")
    use_cache_dir(parser, None)
    assert CACHE_ENV not in os.environ
    use_cache_dir(parser, parser.parse_args(["--cache-dir", "features"]).cache_dir)
    assert os.environ[CACHE_ENV] == str(tmp_path / "features")
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        use_cache_dir(parser, "file")


def test_converters() -> None:
    assert at_least(1)("3") == 3 and probability("1") == 1.0
    for parse, text in ((at_least(1), "0"), (at_least(1), "1.5"), (probability, "0"), (probability, "nan"),
                        (probability, "1.01")):
        with pytest.raises(Exception, match="must be"):
            parse(text)
    assert math.isclose(probability("0.2"), 0.2)


def test_flag_message() -> None:
    flags = {"rounds": "--rounds", "resume": "--resume", "state-dir": "--state-dir", "lot-size": "--lot-size",
             "min-clients": "--clients"}
    assert flag_message("rounds must be >= 1", flags) == "argument --rounds: must be >= 1"
    assert flag_message("lot_size must be an integer >= 1, got 0", flags) == \
        "argument --lot-size: must be an integer >= 1, got 0"
    assert flag_message("min-clients must be >= 1", flags) == "argument --clients: must be >= 1"
    assert flag_message("resume needs state-dir: the folder of the run to continue", flags) == \
        "--resume needs --state-dir: the folder of the run to continue"


def test_check_available_reads_nothing(shared_data_dir: Path, tmp_path: Path) -> None:
    assert check_available("mnist", shared_data_dir) == shared_data_dir
    assert check_available("digits", tmp_path) == tmp_path  # ships with scikit-learn
    with pytest.raises(DatasetNotFoundError, match=r"MNIST not found .*--download"):
        check_available("mnist", tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(b"")  # present but empty: only loading would notice
    assert check_available("mnist", tmp_path) == tmp_path
    with pytest.raises(ValueError, match="unknown data set"):
        check_available("svhn", tmp_path)


def test_check_available_cifar10(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"CIFAR10 not found .*--data-dir"):
        check_available("cifar10", tmp_path)
    write_cifar10(tmp_path, per_batch=1)
    assert check_available("cifar10", tmp_path) == tmp_path
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DatasetNotFoundError, match="CIFAR10 not found"):
        check_available("cifar10", tmp_path)
