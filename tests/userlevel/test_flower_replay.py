"""fedpriv's central user level against Flower's ``DifferentialPrivacyServerSideFixedClipping``
around ``FedAvg`` (``benchmarks.userlevel``): with every client in every round (q = 1, so the
expected cohort is the actual one) and Flower replaying fedpriv's noise stream and training
seeds (``--same-draws``), the two algorithms give the same model up to float rounding;
without the replay they do not (the test bites)."""

import pytest

from benchmarks.userlevel import build_parser, run

pytestmark = pytest.mark.usefixtures("task_identity")


def _run(shared_data_dir, *flags):
    args = build_parser().parse_args(["--clients", "4", "--cohort", "4", "--rounds", "2", "--limit-test", "200",
                                      "--per-client", "20", "--data-dir", str(shared_data_dir), *flags])
    return run(args)


def test_with_the_same_draws_and_divisor_flower_and_fedpriv_give_the_same_model(shared_data_dir):
    same = _run(shared_data_dir, "--same-draws")
    assert same["fedpriv"]["cohort_sizes"] == [4, 4]
    assert same["model_distance"] < 1e-4
    assert same["fedpriv"]["accuracy"] == same["flower"]["accuracy"]
    assert _run(shared_data_dir)["model_distance"] > 100 * same["model_distance"] + 1e-2
