"""Adaptive clipping whatever its noisy counts say (issue 37): the estimate b̃ is clamped to
[0, 1], S stays within its stated bounds (``server.userlevel.CLIP_RANGE``), and no round is
booked that the nodes then refuse. A count noise of 10⁹ used to send S to 0 after round 1:
the nodes refused round 2 and the next exp overflowed, the population already booked."""

import math

import pytest

from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, PrivacyLedger
from server.run import run_server
from server.userlevel import CLIP_RANGE, adapted_clip
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, ROUNDS, CLIP, Z = 3, 2, 0.05, 1.0


def test_the_issues_run_with_a_huge_count_noise_runs_to_the_end_with_s_in_bounds(tmp_path, shared_data_dir):
    # python -m simulations.mnist --clients 3 --rounds 2 --privacy user --cohort 2 --noise-multiplier 1
    #   --user-clip 0.05 --clip-quantile 0.5 --clip-count-noise 1e9 --model cnn --limit-train 60 ...
    config = {"rounds": ROUNDS, "min-clients": NODES, "limit-train": 60, "limit-test": 40, "model": "cnn",
              "data-dir": str(shared_data_dir), "state-dir": str(tmp_path / "server"), "privacy": "user",
              "cohort": 2, "user-clip": CLIP, "clip-quantile": 0.5, "clip-count-noise": 1e9, "noise-multiplier": Z,
              "server-randomness": "seeded", "seed": 0, "lot-size": 10, "epsilon-budget": 100.0}
    keys = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
            "data-dir": str(shared_data_dir)}
    grid = InProcessGrid(config, {10 + i: node_config(i, NODES, tmp_path, **keys) for i in range(NODES)})
    history = run_server(grid, config)
    assert len(history.rounds) == ROUNDS and all(not r.failed for r in history.rounds)
    clips = [r.train_metrics["user_clip"] for r in history.rounds] + [history.resolved["user_level"]["final_clip"]]
    assert all(CLIP / CLIP_RANGE <= s <= CLIP * CLIP_RANGE for s in clips)
    assert all(0 <= r.train_metrics["under_clip_estimate"] <= 1 for r in history.rounds)
    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    assert all(server.events(str(i)) == (PoissonSampledEvent(2 / 3, GaussianEvent(Z)),) * ROUNDS
               for i in range(NODES))


@pytest.mark.parametrize("centred", [-1e300, -5.0, 5.0, 1e300])
@pytest.mark.parametrize("lr", [0.2, 1e300])
def test_any_noisy_count_and_step_size_leave_s_finite_and_in_bounds(centred, lr):
    clip = 1.0
    for _ in range(50):
        clip, estimate = adapted_clip(clip, centred, 2.0, 0.5, lr, (1.0 / CLIP_RANGE, CLIP_RANGE))
        assert math.isfinite(clip) and 1 / CLIP_RANGE <= clip <= CLIP_RANGE
    assert estimate == min(1.0, max(0.0, centred / 2 + 0.5))
    if lr == 1e300:  # one step takes S to the bound its estimate points at
        assert clip == (1 / CLIP_RANGE if estimate > 0.5 else CLIP_RANGE)
