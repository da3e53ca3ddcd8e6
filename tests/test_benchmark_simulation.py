"""benchmarks.simulation's points, memory readings and growth plot (its runs are too long
for the suite: the README reports them)."""

import subprocess
import sys

import pytest

from benchmarks import simulation
from benchmarks._growth_plot import plot_growth
from benchmarks._memory import PeakMemory, pss_bytes


def _points(*argv):
    parser = simulation.build_parser()
    return simulation.points(parser, parser.parse_args(list(argv)))


def test_each_point_fits_mnist_with_the_same_q():
    small, large = _points("--clients", "1000", "10000")
    assert (small.examples_per_client, small.lot_size, small.clients_per_round) == (60, 30, 100)
    assert (large.examples_per_client, large.lot_size, large.clients_per_round) == (6, 3, 1000)
    (given,) = _points("--clients", "500", "--examples-per-client", "10", "--lot-size", "4", "--fraction-train", "0.2")
    assert (given.examples_per_client, given.lot_size, given.clients_per_round) == (10, 4, 100)


def test_a_federation_larger_than_mnist_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        _points("--clients", "1000", "--examples-per-client", "61")
    assert exit_.value.code == 2 and "--clients × --examples-per-client must be <= 60000" in capsys.readouterr().err


def test_peak_memory_counts_the_processes_it_started():
    hold = "b = bytearray(200 * 2**20); import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
    with PeakMemory(interval=0.05) as memory:
        child = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        memory.sample()
        child.communicate()
    assert memory.peak_mb["ray"] >= 190  # the child's 200 MiB, its own pages
    assert memory.peak_mb["driver"] > 0 and memory.peak_mb["total"] >= memory.peak_mb["ray"]
    assert pss_bytes(child.pid) == 0  # gone: nothing to read


def test_the_growth_plot_is_written(tmp_path):
    points = [{"clients": c, "clients_per_round": c // 10, "simulation_median_s": s, "plain_loop_median_s": p,
               "ratio": s / p, "discovery_seconds": d, "memory_peak_mib": {"driver": m, "ray": 2 * m, "total": 3 * m}}
              for c, s, p, d, m in ((1000, 3.0, 1.5, 8.0, 900.0), (10000, 40.0, 15.0, 90.0, 1500.0))]
    plot_growth(points, tmp_path / "growth.png")
    assert (tmp_path / "growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
