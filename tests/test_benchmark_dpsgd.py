"""``benchmarks.dpsgd``'s breakdown: the engine's labelled stages cover its step."""

import torch

from benchmarks.dpsgd import stage_breakdown
from fedpriv.dpsgd.engine import STAGES


def test_the_labelled_stages_account_for_the_step_and_the_noise_is_one_of_them():
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    parts = stage_breakdown("mlp", x, y, torch.device("cpu"), steps=4)
    stages = parts["fedpriv_stages_ms"]
    assert set(stages) == {name.removeprefix("dpsgd.") for name in STAGES} | {"other"}
    assert all(stages[name.removeprefix("dpsgd.")] > 0 for name in STAGES)
    assert parts["nonprivate_step_ms"] > 0
    # The labels cover the loop: what is left outside them is a small part of the step.
    assert 0 <= stages["other"] < 0.25 * parts["fedpriv_step_ms"]
