"""simulations._gpu: the Ray GPU share of a simulated client, from its measured step (the
measurement runs on the CPU, so no GPU is needed to check it)."""

import pytest

from fedpriv.federation.settings import RunSettings
from simulations._gpu import client_gpu_fraction, likely_largest_lot

GIB = 1 << 30


def test_likely_largest_lot() -> None:
    assert likely_largest_lot(4096) == 4096 + 256
    assert likely_largest_lot(100) == 140


def test_share_grows_with_the_step_and_shrinks_with_the_gpu() -> None:
    auto = RunSettings.from_run_config({"model": "mlp", "lot-size": 256})
    big_batch = RunSettings.from_run_config({"model": "mlp", "lot-size": 256, "max-physical-batch": 4096})
    assert client_gpu_fraction(auto, 10, 80 * GIB) == pytest.approx(0.05)  # context, MLP, 6k examples
    assert client_gpu_fraction(auto, 10, 2 * GIB) == pytest.approx(0.3)  # (0.5 GiB + ~20 MiB) / 2 GiB
    assert client_gpu_fraction(big_batch, 10, 2 * GIB) > client_gpu_fraction(auto, 10, 2 * GIB)
    # CIFAR's CNN, 3.6 MB an example: the plan's lot of 1,024 shared out (102 a client), or per client
    shared = RunSettings.from_run_config({"dataset": "cifar10"})
    own = RunSettings.from_run_config({"dataset": "cifar10", "lot-size": 1024})
    assert client_gpu_fraction(shared, 10, 4 * GIB) == pytest.approx(0.3)  # (0.5 + 0.06 + 0.5/0.8) / 4 GiB
    assert client_gpu_fraction(own, 10, 4 * GIB) == 1.0 > client_gpu_fraction(own, 10, 80 * GIB)
