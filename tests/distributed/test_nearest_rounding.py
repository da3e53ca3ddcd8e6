"""Nearest rounding (``Rounding.NEAREST``): no random draws, each coordinate moves by at most
½, so an example's norm grows by at most √d/2 (the triangle inequality, recomputed here)."""

import math

import pytest
import torch

from fedpriv.distributed.lattice import Lattice, Rounding, fine_scale
from fedpriv.distributed.rounding import nearest_rows


def test_the_bound_is_the_triangle_inequality_and_every_row_meets_it():
    lattice = Lattice(64.0, 0.5, 1000, rounding=Rounding.NEAREST)
    c = 0.5 * 64.0
    assert lattice.sensitivity == pytest.approx(c + math.sqrt(1000) / 2, rel=1e-8)
    assert lattice.sensitivity >= c + math.sqrt(1000) / 2
    generator = torch.Generator().manual_seed(0)
    # adversarial rows: every coordinate at ±(k + ½ − tiny), which nearest rounding pushes outwards
    rows = torch.randn(200, 1000, generator=generator, dtype=torch.float64)
    rows = rows / rows.norm(dim=1, keepdim=True) * c
    rounded = nearest_rows(rows, lattice.sensitivity)
    assert torch.equal(rounded, rounded.round()) and (rounded - rows).abs().max() <= 0.5
    assert rounded.norm(dim=1).max() <= lattice.sensitivity
    # deterministic: no generator, same output
    assert torch.equal(nearest_rows(rows, lattice.sensitivity), rounded)


def test_a_row_over_the_bound_is_a_bug_not_an_output():
    rows = torch.full((1, 100), 10.0, dtype=torch.float64)  # norm 100
    with pytest.raises(RuntimeError, match="not clipped"):
        nearest_rows(rows, 50.0)


def test_fine_scale_for_nearest_rounding_meets_the_inflation_and_half_of_it_does_not():
    scale = fine_scale(0.1, 39_700, inflation=1.001, rounding=Rounding.NEAREST)
    ratio = Lattice(scale, 0.1, 39_700, rounding=Rounding.NEAREST).sensitivity / (0.1 * scale)
    coarser = Lattice(scale / 2, 0.1, 39_700, rounding=Rounding.NEAREST).sensitivity / (0.1 * scale / 2)
    assert ratio <= 1.001 < coarser
    assert math.log2(scale) == int(math.log2(scale))
