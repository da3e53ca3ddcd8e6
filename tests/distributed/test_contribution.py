"""One node's contribution, decoded as the server would (two nodes' vectors summed mod 2^32):
without noise it is the engine's clipped-gradient sum of the union lot (the book-keeping
path, not the per-example one used here) within the quantization bound √d·(examples)/scale;
with noise, the decoded sum minus the clean one has per-coordinate std σ·C (two honest
shares), tested with a χ² variance test at fixed seeds."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from fedpriv.distributed import Lattice, check_headroom, decode_sum, distributed_contribution, unflatten
from fedpriv.dpsgd import DPSGDConfig, GradSampleMode
from fedpriv.dpsgd.engine import add_clipped_sums_, clipped_sum_function, gradient_buffers
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.sampling import poisson_lot

RATE, C, RECORDS = 0.3, 0.5, 150
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(30, 30), nn.Tanh(), nn.Linear(30, 3))  # d = 1023


def node_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(RECORDS, 30, generator=generator) * 3, torch.randint(0, 3, (RECORDS,), generator=generator)


def dimension(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def contribute(model, data, node: int, lattice: Lattice, noise_multiplier: float, noise_seed: int | None = None):
    device = data[0].device
    return distributed_contribution(
        model, *data, sample_rate=RATE, lattice=lattice, noise_multiplier=noise_multiplier, honest_shares=2,
        sampling_generator=torch.Generator(device).manual_seed(100 + node),
        rounding_generator=torch.Generator(device).manual_seed(200 + node),
        noise_generator=None if noise_seed is None else np.random.default_rng(noise_seed), secure=False,
        max_physical_batch_size=16,
    )


def engine_clipped_sum(model: nn.Module, data, lot: torch.Tensor) -> torch.Tensor:
    """The engine's Σ_i clip_C(g_i) over ``lot`` (book-keeping clipping), flat, in float64."""
    params = trainable_parameters(model)
    config = DPSGDConfig(noise_multiplier=0.0, max_grad_norm=C, sample_rate=RATE,
                         grad_sample_mode=GradSampleMode.BOOKKEEPING)
    flat, grads = gradient_buffers(params)
    flat.zero_()
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        add_clipped_sums_(clipped_sum, *data, lot, grads, config)
    return flat.double().cpu()


def server_decodes(contributions, lattice: Lattice) -> torch.Tensor:
    modular_sum = sum(c.vector for c in contributions) % np.uint64(lattice.modulus)
    return decode_sum(modular_sum, lattice)


def union_reference(model, nodes) -> tuple[torch.Tensor, int]:
    device = nodes[0][0].device
    lots = [poisson_lot(RECORDS, RATE, torch.Generator(device).manual_seed(100 + node)) for node in range(len(nodes))]
    return sum(engine_clipped_sum(model, data, lot) for data, lot in zip(nodes, lots)), sum(map(len, lots))


@pytest.mark.parametrize("device", DEVICES)
def test_without_noise_the_decoded_sum_is_the_engines_clipped_sum_of_the_union_lot(device):
    model = small_model().to(device)
    nodes = [tuple(t.to(device) for t in node_data(seed)) for seed in (1, 2)]
    lattice = Lattice(scale=2.0**20, max_grad_norm=C, dimension=dimension(model))
    check_headroom(lattice, 2 * RECORDS, 0.0)
    reference, examples = union_reference(model, nodes)
    contributions = [contribute(model, data, node, lattice, 0.0) for node, data in enumerate(nodes)]
    assert sum(c.lot_size for c in contributions) == examples > 0
    assert all(c.vector.dtype == np.uint64 and c.vector.shape == (lattice.dimension,) for c in contributions)
    decoded = server_decodes(contributions, lattice)
    quantization = math.sqrt(lattice.dimension) * examples / lattice.scale
    assert float(torch.linalg.vector_norm(decoded - reference)) <= quantization + 1e-4
    unclipped = union_reference_unclipped(model, nodes)
    assert float(torch.linalg.vector_norm(unclipped - reference)) > 100 * (quantization + 1e-4)  # clipping bites


def union_reference_unclipped(model, nodes) -> torch.Tensor:
    total = torch.zeros(dimension(model), dtype=torch.float64)
    for node, (features, labels) in enumerate(nodes):
        lot = poisson_lot(RECORDS, RATE, torch.Generator(features.device).manual_seed(100 + node))
        model.zero_grad()
        F.cross_entropy(model(features[lot]), labels[lot], reduction="sum").backward()
        total += torch.cat([p.grad.flatten() for p in model.parameters()]).double().cpu()
    return total


def test_the_noise_of_two_honest_shares_has_the_centralized_std():
    """Same lots and rounding with and without noise: the decoded difference is the noise
    alone, N_Z(0, s²) + N_Z(0, s²) with s = σ·C·scale/√2, so std σ·C per coordinate."""
    model = small_model()
    nodes = [node_data(1), node_data(2)]
    sigma = 1.7
    lattice = Lattice(scale=2.0**8, max_grad_norm=C, dimension=dimension(model))
    clean = server_decodes([contribute(model, data, node, lattice, 0.0) for node, data in enumerate(nodes)], lattice)
    noisy = server_decodes([contribute(model, data, node, lattice, sigma, noise_seed=300 + node)
                            for node, data in enumerate(nodes)], lattice)
    z = ((noisy - clean) / (sigma * C)).numpy()  # ~ N(0, 1), d of them
    assert abs(z.mean()) < 5 / math.sqrt(len(z))
    chi2 = float((z**2).sum())
    assert stats.chi2(len(z)).sf(chi2) > 1e-4 and stats.chi2(len(z)).cdf(chi2) > 1e-4
    assert stats.chi2(len(z)).cdf(chi2 / 2) < 1e-4  # the test tells std σ·C·√2 apart (shares not divided by √n)


def test_a_non_finite_example_adds_nothing_as_in_the_engine():
    model = small_model()
    features, labels = node_data(1)
    lot = poisson_lot(RECORDS, RATE, torch.Generator().manual_seed(100))
    features[lot[0], 0] = math.nan
    lattice = Lattice(scale=2.0**20, max_grad_norm=C, dimension=dimension(model))
    decoded = server_decodes([contribute(model, (features, labels), 0, lattice, 0.0)], lattice)
    assert torch.isfinite(decoded).all()
    reference = engine_clipped_sum(model, (features, labels), lot)
    bound = math.sqrt(lattice.dimension) * len(lot) / lattice.scale
    assert float(torch.linalg.vector_norm(decoded - reference)) <= bound + 1e-4


def test_a_secure_contribution_draws_everything_from_the_os():
    """At q = 1 the lot is every record, whatever the randomness: the decoded sum is then the
    engine's clipped sum of all records within the quantization bound."""
    model = small_model()
    data = node_data(3)
    lattice = Lattice(scale=2.0**20, max_grad_norm=C, dimension=dimension(model))
    contribution = distributed_contribution(
        model, *data, sample_rate=1.0, lattice=lattice, noise_multiplier=0.0, honest_shares=1,
        sampling_generator=None, rounding_generator=None, noise_generator=None, secure=True)
    assert contribution.lot_size == RECORDS
    reference = engine_clipped_sum(model, data, torch.arange(RECORDS))
    bound = math.sqrt(lattice.dimension) * RECORDS / lattice.scale
    assert float(torch.linalg.vector_norm(decode_sum(contribution.vector, lattice) - reference)) <= bound + 1e-4


def test_generators_are_checked_before_anything_is_drawn():
    model = small_model()
    data = node_data(1)
    lattice = Lattice(scale=2.0**8, max_grad_norm=C, dimension=dimension(model))
    shared = torch.Generator().manual_seed(0)
    base = dict(sample_rate=RATE, lattice=lattice, noise_multiplier=1.0, honest_shares=2)
    cases = [
        (dict(sampling_generator=shared, rounding_generator=None, noise_generator=None, secure=True), "no generators"),
        (dict(sampling_generator=shared, rounding_generator=shared, noise_generator=np.random.default_rng(0),
              secure=False), "separate"),
        (dict(sampling_generator=shared, rounding_generator=torch.Generator(), noise_generator=None, secure=False),
         "noise_generator"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            distributed_contribution(model, *data, **base, **kwargs)
    with pytest.raises(ValueError, match="trainable parameters"):
        distributed_contribution(model, *data, **{**base, "lattice": Lattice(2.0, C, 7)}, sampling_generator=shared,
                                 rounding_generator=torch.Generator(), noise_generator=np.random.default_rng(0),
                                 secure=False)


def test_decode_sum_refuses_what_is_not_a_modular_sum():
    lattice = Lattice(scale=2.0, max_grad_norm=1.0, dimension=3, modulus_bits=8)
    assert decode_sum(np.array([0, 127, 128], dtype=np.uint64), lattice).tolist() == [0.0, 63.5, -64.0]
    for bad in (np.array([0, 1, 256], dtype=np.uint64), np.array([0, -1, 2]), np.zeros(4, dtype=np.uint64),
                np.zeros(3), [0, 1, 2]):
        with pytest.raises(ValueError, match="modular sum"):
            decode_sum(bad, lattice)


def test_unflatten_gives_each_parameter_its_part_in_order():
    model = small_model()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    parts = unflatten(flat, model)
    assert list(parts) == [name for name, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert parts[name].dtype == p.dtype and torch.equal(parts[name], p.detach())
    with pytest.raises(ValueError, match="shape"):
        unflatten(flat[:-1], model)
