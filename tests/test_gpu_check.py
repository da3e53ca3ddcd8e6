"""``benchmarks.gpu_check`` stays runnable where CI has no GPU: its engine comparison, with
the CPU standing in for the device, finds the engine's clipped sums equal to its float64
per-example reference and every contribution within C."""

import pytest
import torch

from benchmarks import gpu_check
from fedpriv.dpsgd import Clipping, GradSampleMode


@pytest.mark.parametrize(("mode", "clipping"), [(GradSampleMode.BOOKKEEPING, Clipping.FLAT),
                                                 (GradSampleMode.VMAP, Clipping.PER_LAYER)])
def test_the_engine_comparison_passes_with_the_cpu_as_the_device(monkeypatch, mode, clipping) -> None:
    monkeypatch.setattr(gpu_check, "DEVICE", torch.device("cpu"))
    case = gpu_check.engine_case("cnn", mode, clipping)
    assert case["agree"] and case["within_c"]
    assert case["cpu_vs_reference"] < gpu_check.AGREE
    # about half the examples are clipped (C is their median norm), so the bound is reached
    assert case["cuda"]["max_contribution_over_c"] > (0.99 if clipping is Clipping.FLAT else 0.5)


def test_a_wrong_clipped_sum_is_told_from_the_reference() -> None:
    model, x, y, per_example = gpu_check._case_data("mlp")
    reference = gpu_check.reference_clipped_sum(per_example, 1.0, Clipping.FLAT)
    unclipped = gpu_check.reference_clipped_sum(per_example, float("inf"), Clipping.FLAT)
    assert gpu_check._relative(unclipped, reference) > 100 * gpu_check.AGREE
