"""A map-style data set of any size (``fedpriv.dpsgd.items``): it is read once to be checked,
keeping no x; then each Poisson lot is drawn as indices and only its items are fetched, a
micro-batch at a time, and the training equals the in-memory tensor pair's for one seed."""

import pytest
import torch
from torch import nn

from fedpriv.dpsgd import train_dpsgd
from fedpriv.dpsgd.config import DPSGDConfig, GradSampleMode
from fedpriv.dpsgd.items import ItemFeatures
from fedpriv.dpsgd.sampling import micro_batches, poisson_lot
from fedpriv.task import as_tensors

N, PHYSICAL, STEPS, SEED = 300, 16, 4, 3


class Fetched(torch.utils.data.Dataset):
    """A map-style data set (no TensorDataset) that records every fetch and refuses one of
    more than ``most`` items at once (torch's batched ``__getitems__``)."""

    def __init__(self, x, y, most=PHYSICAL):
        self.x, self.y, self.most = x, y, most
        self.single, self.batches = 0, []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.single += 1
        return self.x[i].numpy(), int(self.y[i])

    def __getitems__(self, indices):
        if len(indices) > self.most:
            raise AssertionError(f"{len(indices)} items fetched at once, more than {self.most}")
        self.batches.append(list(indices))
        return [(self.x[i], int(self.y[i])) for i in indices]


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 5, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def _train(features, labels, mode):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    config = DPSGDConfig(noise_multiplier=1.0, max_grad_norm=0.5, sample_rate=0.2, max_physical_batch_size=PHYSICAL,
                         grad_sample_mode=mode)
    report = train_dpsgd(model, features, labels, config=config, steps=STEPS,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                         sampling_generator=torch.Generator().manual_seed(SEED),
                         noise_generator=torch.Generator().manual_seed(SEED + 1))
    return model, report


@pytest.mark.parametrize("mode", [GradSampleMode.BOOKKEEPING, GradSampleMode.VMAP])
def test_lots_fetch_only_their_items_and_train_as_the_tensor_pair(mode):
    x, y = _data()
    data = Fetched(x, y)
    lazy = as_tensors(data, "train", lazy=True)
    assert isinstance(lazy.features, ItemFeatures) and lazy.features.shape == x.shape
    assert data.single == N and not data.batches  # checked once, item by item; no x kept
    assert torch.equal(lazy.labels, y)

    model, report = _train(lazy.features, lazy.labels, mode)
    expected, _ = _train(x, y, mode)

    sampling = torch.Generator().manual_seed(SEED)  # the same lots, drawn again
    lots = [poisson_lot(N, 0.2, sampling) for _ in range(STEPS)]
    assert data.batches == [b.tolist() for lot in lots for b in micro_batches(lot, PHYSICAL)]
    assert data.single == N  # no item fetched one by one while training
    assert report.mean_loss == pytest.approx(_train(x, y, mode)[1].mean_loss, rel=1e-6)
    for p, q in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)  # same lots, noise, clipped sums


def test_a_data_set_without_getitems_is_fetched_item_by_item_within_the_lot():
    x, y = _data()
    data = Fetched(x, y)
    data.__getitems__ = None  # as a plain Dataset: __getitem__ alone
    lazy = as_tensors(data, "train", lazy=True)
    data.single = 0
    _train(lazy.features, lazy.labels, GradSampleMode.BOOKKEEPING)
    sampling = torch.Generator().manual_seed(SEED)
    assert data.single == sum(len(poisson_lot(N, 0.2, sampling)) for _ in range(STEPS))


def test_an_item_that_changes_after_the_check_is_an_error_not_a_wrong_shape():
    x, y = _data()
    data = Fetched(x, y)
    lazy = as_tensors(data, "train", lazy=True)
    data.x = torch.randn(N, 6)
    with pytest.raises(ValueError, match=r"item 3 changed: x is \(6,\)"):
        lazy.features[torch.tensor([3])]
