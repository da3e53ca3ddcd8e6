"""The classic algorithms' networks are tiny: one torch thread is faster than two that contend."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
