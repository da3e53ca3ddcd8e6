"""Conditional randomized rounding: integers next to the input, unbiased where no row is
redrawn, every row within the bound, the bound recomputed here from Kairouz, Liu & Steinke
2021, Theorem 1.  Seeded at fixed seeds; the OS CSPRNG path's statistical check fails a
correct rounding with probability < 10⁻⁵."""

import math

import pytest
import torch

from fedpriv.distributed.lattice import Lattice
from fedpriv.distributed.rounding import MAX_TRIES, conditional_round


def paper_bound(clip: float, dimension: int, beta: float) -> float:
    """√min((c + √d)², c² + d/4 + √(2 ln(1/β))·(c + √d/2)), the paper's expression."""
    root_d, tail = math.sqrt(dimension), math.sqrt(2 * math.log(1 / beta))
    return math.sqrt(min((clip + root_d) ** 2, clip**2 + dimension / 4 + tail * (clip + root_d / 2)))


def rows_of_norm(count: int, dimension: int, norm: float, seed: int) -> torch.Tensor:
    rows = torch.randn(count, dimension, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return rows * (norm / torch.linalg.vector_norm(rows, dim=1, keepdim=True))


@pytest.mark.parametrize("secure", [False, True])
def test_each_entry_is_the_floor_or_the_ceiling(secure):
    rows = torch.randn(64, 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5
    rounded = conditional_round(rows, 1e6, None if secure else torch.Generator().manual_seed(1))
    assert rounded.dtype == torch.int64 and rounded.shape == rows.shape
    assert bool(((rounded == rows.floor()) | (rounded == rows.ceil())).all())


@pytest.mark.parametrize("secure", [False, True])
def test_rounding_is_unbiased_where_the_bound_never_binds(secure):
    """M roundings of one vector, bound ‖x‖ + √d (never exceeded): each coordinate's mean is
    x within 5.5 binomial standard errors √(f(1 − f)/M) (Bonferroni over d: < 10⁻⁵)."""
    dimension, copies = 40, 20_000
    x = torch.empty(dimension, dtype=torch.float64).uniform_(-4, 4, generator=torch.Generator().manual_seed(3))
    x[:3] = torch.tensor([2.0, -1.0, 0.5])  # integers stay put; a half is a fair coin
    bound = float(torch.linalg.vector_norm(x)) + math.sqrt(dimension)
    rounded = conditional_round(x.repeat(copies, 1), bound, None if secure else torch.Generator().manual_seed(4))
    fraction = x - x.floor()
    error = rounded.double().mean(0) - x
    assert torch.equal(rounded[:, :2], x[:2].long().repeat(copies, 1))
    spread = (fraction * (1 - fraction) / copies).sqrt()
    moving = fraction > 0
    assert bool((error[moving].abs() < 5.5 * spread[moving]).all())


@pytest.mark.parametrize(("clip", "dimension", "beta"), [(50.0, 1000, math.exp(-0.5)), (3.0, 400, math.exp(-0.5)),
                                                         (0.01, 1, 1e-10), (20.0, 10, 1e-10)])
def test_the_lattice_sensitivity_is_the_papers_bound(clip, dimension, beta):
    """Both of the minimum's terms are reached (the first for a tiny c and β)."""
    lattice = Lattice(scale=clip * 4, max_grad_norm=0.25, dimension=dimension, beta=beta)
    assert lattice.sensitivity == pytest.approx(paper_bound(clip, dimension, beta), rel=1e-12)


def test_every_row_is_within_the_bound_even_where_plain_rounding_is_not():
    """Rows of ±1.5 (fractions ½, the rounding's largest variance) of norm c: plain randomized
    rounding exceeds the paper's bound in a share of rows (~9 %, computed here), conditional
    rounding in none."""
    dimension, count = 1000, 2000
    clip = 1.5 * math.sqrt(dimension)
    lattice = Lattice(scale=clip, max_grad_norm=1.0, dimension=dimension)
    bound = paper_bound(clip, dimension, lattice.beta)
    signs = torch.randint(0, 2, (count, dimension), generator=torch.Generator().manual_seed(5)) * 2 - 1
    rows = 1.5 * signs.double()
    plain = rows.floor() + (torch.rand(rows.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
                            < rows - rows.floor())
    assert (torch.linalg.vector_norm(plain, dim=1) > bound).sum() > count // 20  # the bound binds
    rounded = conditional_round(rows, lattice.sensitivity, torch.Generator().manual_seed(7))
    assert bool((rounded.square().sum(1) <= bound**2).all())
    secure = conditional_round(rows, lattice.sensitivity, None)
    assert bool((secure.square().sum(1) <= bound**2).all())


def test_a_row_that_cannot_meet_the_bound_is_a_bug_not_a_loop():
    rows = torch.full((1, 4), 10.0, dtype=torch.float64)  # norm 20, bound 1: no rounding fits
    with pytest.raises(RuntimeError, match=f"after {MAX_TRIES} tries"):
        conditional_round(rows, 1.0, torch.Generator().manual_seed(0))


def test_rows_and_bounds_it_cannot_round_exactly_are_refused():
    generator = torch.Generator().manual_seed(0)
    for entry in (math.nan, 2.0**27):
        rows = torch.tensor([[entry, 0.0]], dtype=torch.float64)
        with pytest.raises(ValueError, match="finite"):
            conditional_round(rows, 10.0, generator)
    with pytest.raises(ValueError, match="float64"):
        conditional_round(torch.zeros(2, 3), 10.0, generator)
    for bound in (-1.0, math.nan, 2.0**27):
        with pytest.raises(ValueError, match="bound"):
            conditional_round(torch.zeros(2, 3, dtype=torch.float64), bound, generator)


def test_the_seeded_rounding_is_reproducible_from_its_generator():
    rows = rows_of_norm(10, 300, 40.0, seed=8)
    first = conditional_round(rows, 41.0, torch.Generator().manual_seed(9))
    assert torch.equal(first, conditional_round(rows, 41.0, torch.Generator().manual_seed(9)))
    assert not torch.equal(first, conditional_round(rows, 41.0, torch.Generator().manual_seed(10)))
