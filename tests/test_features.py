"""Scattering features: shape, per-image independence, and wavelet properties that hold
for any correct scattering transform (checked against closed forms, not our own output)."""

import math

import pytest
import torch

from fedpriv.features import ANGLES, COEFFICIENTS, SCALES, scattering_features


def test_coefficient_count_is_the_closed_form() -> None:
    # 1 low-pass + J·L first order + L²·J(J−1)/2 second order (j2 > j1) per channel.
    assert COEFFICIENTS == 1 + SCALES * ANGLES + ANGLES**2 * math.comb(SCALES, 2) == 81
    out = scattering_features(torch.rand(3, 3, 32, 32))
    assert out.shape == (3, 3 * 81, 8, 8)


def test_each_image_independent_of_its_batch() -> None:
    images = torch.rand(50, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    whole = scattering_features(images, batch_size=16)
    assert torch.equal(whole[10:30], scattering_features(images[10:30], batch_size=7))


def test_constant_image_low_pass_only() -> None:
    # Wavelets have zero mean and the low-pass filter has unit mass: a constant image c has
    # zeroth-order coefficients c and (up to padding effects at the border) no wavelet energy.
    c = 0.7
    out = scattering_features(torch.full((1, 1, 28, 28), c))[0]
    assert torch.allclose(out[0], torch.full((7, 7), c), atol=1e-4)
    assert out[1:].abs().max() < 1e-6


def test_wavelet_coefficients_are_moduli_and_linear_in_scale() -> None:
    # Every coefficient after the low-pass is an average of a modulus: non-negative; and the
    # transform is positively homogeneous: S(a·x) = a·S(x) for a > 0.
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    out = scattering_features(x)
    assert (out[:, 1:] >= -1e-6).all()
    assert torch.allclose(scattering_features(2.5 * x), 2.5 * out, rtol=1e-4, atol=1e-5)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="N, C, H, W"):
        scattering_features(torch.zeros(28, 28))
    with pytest.raises(ValueError, match="multiples of 4"):
        scattering_features(torch.zeros(1, 1, 30, 30))
