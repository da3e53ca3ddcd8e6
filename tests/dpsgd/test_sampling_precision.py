"""The Poisson samplers keep each example with probability ⌊q·2⁵³⌋/2⁵³ ≤ q, the rate the
accountant books, and a q they cannot draw faithfully is refused before anything is booked.

A float32 ``torch.rand(n) < q`` keeps each example with probability ⌈q·2²⁴⌉/2²⁴ ≥ 2⁻²⁴: a
request at q = 1e-12 for 20,000 steps then books ε ≈ 0 while its lots cost ε ≈ 12.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from fedpriv.algorithms import dpdropout, dppca
from fedpriv.dpsgd import ConfigError, DPSGDConfig, steps_per_epoch
from fedpriv.dpsgd.sampling import poisson_lot, secure_poisson_lot
from fedpriv.privacy.__main__ import main as privacy_command
from fedpriv.privacy.events import MIN_SAMPLE_RATE, dpsgd_event

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_an_example_is_kept_iff_its_53_bit_draw_is_below_q_times_2_to_the_53(device):
    # the reference: the seeded generator's own 53-bit integers, one per example
    n, seed = 2**16, 5
    draws = torch.randint(0, 2**53, (n,), generator=torch.Generator(device).manual_seed(seed), device=device)
    smallest = int(draws.min())
    just_above, at = (smallest + 1) / 2**53, smallest / 2**53  # exact: integers below 2⁵³ over 2⁵³
    lot = poisson_lot(n, just_above, torch.Generator(device).manual_seed(seed))
    assert lot.device.type == device and lot.tolist() == [int(draws.argmin())]
    assert poisson_lot(n, at, torch.Generator(device).manual_seed(seed)).numel() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="2³² draws: fast on a GPU only")
def test_the_real_inclusion_rate_at_a_tiny_q_is_q_not_two_to_the_minus_24():
    q, chunk, chunks = 2.0**-30, 2**28, 16
    generator = torch.Generator("cuda").manual_seed(0)
    kept = sum(poisson_lot(chunk, q, generator).numel() for _ in range(chunks))
    draws = chunk * chunks  # 2³²: 4 expected at q, 256 at float32's 2⁻²⁴
    assert stats.binomtest(kept, draws, q).pvalue > 1e-4
    assert stats.binomtest(kept, draws, 2.0**-24).pvalue < 1e-4  # the test can tell


def test_the_secure_sampler_uses_the_same_rule():
    # ⌊q·2⁵³⌋/2⁵³: 1 at q = 1; at q = 1.5·2⁻³³ 10⁵ draws keep one with probability 2·10⁻⁵
    assert torch.equal(secure_poisson_lot(9, 1.0, "cpu"), torch.arange(9))
    assert secure_poisson_lot(10**5, 1.5 * MIN_SAMPLE_RATE, "cpu").numel() == 0


@pytest.mark.parametrize("q", [1e-12, MIN_SAMPLE_RATE / 2, 2.0**-53, 5e-324, 0.0])
def test_a_q_the_samplers_cannot_draw_is_refused_everywhere_it_is_set(q):
    with pytest.raises(ConfigError, match="sample_rate"):
        DPSGDConfig(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=q)
    for refuse in (lambda: dpsgd_event(1.0, q, 20_000), lambda: steps_per_epoch(q),
                   lambda: poisson_lot(10, q, torch.Generator()), lambda: secure_poisson_lot(10, q, "cpu"),
                   lambda: dppca.pca_event(1.0, q),
                   lambda: dpdropout.settings("digits", "dpsgd", fixed_sample_rate=q)):
        with pytest.raises(ValueError, match="sample_rate"):
            refuse()


def test_the_smallest_accepted_q_is_drawn_within_a_relative_two_to_the_minus_20():
    for q in (MIN_SAMPLE_RATE, np.nextafter(MIN_SAMPLE_RATE, 1.0), 1.7 * MIN_SAMPLE_RATE, 1e-9):
        DPSGDConfig(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=q)
        realised = np.floor(q * 2.0**53) / 2.0**53
        assert q * (1 - 2.0**-20) < realised <= q


def test_the_privacy_command_refuses_such_a_q_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        privacy_command(["epsilon", "--noise-multiplier", "1", "--sample-rate", "1e-12", "--steps", "20000",
                         "--delta", "1e-5"])
    out = capsys.readouterr()
    assert exit_info.value.code == 2 and out.err.count("\n") == 1 and "1e-12" in out.err
