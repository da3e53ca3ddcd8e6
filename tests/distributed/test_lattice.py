"""The lattice's public choices: ``fine_scale`` (the coarsest power of two within the
requested inflation, by the paper's formula recomputed here), the noise share (n shares
sum to the centralized σ·C·scale), and ``check_headroom`` (refuses exactly where a worst-case
sum would wrap the modulus and decode wrong)."""

import math

import numpy as np
import pytest

from fedpriv.distributed.contribution import decode_sum
from fedpriv.distributed.lattice import NOISE_TAIL, Lattice, check_headroom, fine_scale
from tests.distributed.test_conditional_rounding import paper_bound


@pytest.mark.parametrize(("max_grad_norm", "dimension", "inflation"),
                         [(1.0, 39_700, 1.001), (0.1, 1000, 1.01), (3.0, 10**6, 1.0001), (1e-3, 5, 1.5)])
def test_fine_scale_is_the_coarsest_power_of_two_within_the_inflation(max_grad_norm, dimension, inflation):
    scale = fine_scale(max_grad_norm, dimension, inflation)
    assert math.frexp(scale)[0] == 0.5  # a power of two
    beta = math.exp(-0.5)
    clip = max_grad_norm * scale
    assert paper_bound(clip, dimension, beta) / clip <= inflation * (1 + 1e-12)
    assert paper_bound(clip / 2, dimension, beta) / (clip / 2) > inflation
    assert Lattice(scale, max_grad_norm, dimension).sensitivity / clip <= inflation * (1 + 1e-12)


def test_fine_scale_refuses_an_inflation_it_cannot_reach():
    with pytest.raises(ValueError, match="inflation"):
        fine_scale(1.0, 100, 1.0)
    with pytest.raises(ValueError, match="inflation"):
        fine_scale(1.0, 100, math.nan)


def test_honest_shares_sum_to_the_centralized_noise():
    lattice = Lattice(scale=256.0, max_grad_norm=0.5, dimension=10)
    for shares in (1, 3, 100):
        share = lattice.noise_stddev(1.3, shares)
        assert math.sqrt(shares * share**2) == pytest.approx(1.3 * 0.5 * 256.0, rel=1e-12)
    assert lattice.noise_stddev(0.0, 5) == 0.0
    for bad in ((-1.0, 2), (math.inf, 2), (1.0, 0), (1.0, 2.5)):
        with pytest.raises(ValueError):
            lattice.noise_stddev(*bad)


def worst_case_decodes(lattice: Lattice, max_lot: int, total_noise_stddev: float) -> bool:
    """Whether the largest sum ``check_headroom`` must allow for (max_lot examples each ⌊Δ₂⌋
    in one coordinate, plus 12σ of noise; and its negative) survives mod 2^bits and decoding."""
    reach = max_lot * math.floor(lattice.sensitivity) + math.floor(NOISE_TAIL * total_noise_stddev)
    true_sum = np.array([reach, -reach] + [0] * (lattice.dimension - 2), dtype=np.int64)
    decoded = decode_sum(np.mod(true_sum, lattice.modulus).astype(np.uint64), lattice)
    return bool(np.array_equal(decoded.numpy() * lattice.scale, true_sum))


def test_check_headroom_refuses_exactly_where_the_sum_could_wrap():
    lattice = Lattice(scale=2.0**10, max_grad_norm=1.0, dimension=4, modulus_bits=32)
    sigma = 3.0 * lattice.clip
    room = 2**31 - NOISE_TAIL * sigma
    largest_lot = math.floor(room / lattice.sensitivity)
    largest_lot -= largest_lot * lattice.sensitivity + NOISE_TAIL * sigma >= 2**31
    check_headroom(lattice, largest_lot, sigma)
    assert worst_case_decodes(lattice, largest_lot, sigma)
    with pytest.raises(ValueError, match="could wrap"):
        check_headroom(lattice, largest_lot + 1, sigma)
    coarse = Lattice(scale=2.0**10, max_grad_norm=1.0, dimension=4, modulus_bits=20)  # a lot that wraps
    with pytest.raises(ValueError, match="could wrap"):
        check_headroom(coarse, 600, 0.0)
    assert not worst_case_decodes(coarse, 600, 0.0)


@pytest.mark.parametrize("kwargs", [dict(scale=0.0), dict(scale=math.inf), dict(max_grad_norm=-1.0),
                                    dict(dimension=0), dict(dimension=2.0), dict(beta=1.0), dict(modulus_bits=63),
                                    dict(modulus_bits=True)])
def test_a_lattice_out_of_range_is_refused(kwargs):
    with pytest.raises(ValueError):
        Lattice(**{"scale": 2.0, "max_grad_norm": 1.0, "dimension": 3, **kwargs})
