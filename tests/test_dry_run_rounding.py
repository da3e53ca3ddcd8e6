"""``--dry-run`` plans with the rounding the run uses (issue 34): the plan the simulations
print (``simulations._advice.federation``, what ``dry_run`` plans) has, for each
``lattice-rounding``, the σ and ε per round of the server's own setup of that run."""

import pytest

from fedpriv.federation.settings import RunSettings
from fedpriv.planning import plan
from simulations._advice import federation
from tests.privacy.test_planner_equals_run import DELTA, LOT, ROUNDS, SIZES, _run_side


def test_the_dry_runs_plan_is_the_runs_setup_for_either_rounding():
    sigmas = {}
    for rounding in ("nearest", "conditional"):
        config = {"model": "cnn", "rounds": ROUNDS, "lot-size": LOT, "delta": DELTA, "privacy": "distributed",
                  "lattice-rounding": rounding, "target-epsilon": 4.0}
        sigma, server_eps, _ = _run_side(config)
        column = plan(federation(RunSettings.from_run_config(config), len(SIZES), SIZES),
                      ["distributed"])["modes"]["distributed"]
        assert column["noise_multiplier"] == pytest.approx(sigma, rel=1e-9)
        assert column["epsilon"] == pytest.approx(server_eps, rel=1e-9)
        sigmas[rounding] = sigma
    assert sigmas["nearest"] != pytest.approx(sigmas["conditional"], rel=1e-6)  # the rounding matters here
