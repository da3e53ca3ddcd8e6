"""``python -m simulations.accountants``: the numbers it draws for the sound accountants are
dp-accounting's own (RDP and PLD computed here directly), the σ's it draws reach their ε,
and the papers' recipes are labelled as such."""

import json

import dp_accounting
import pytest

from fedpriv.privacy.accountants.rdp import ORDERS
from simulations import accountants


def _rdp() -> dp_accounting.rdp.RdpAccountant:
    """dp-accounting's own RDP accountant on fedpriv's grid of orders."""
    return dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))


def _dpsgd(sigma: float, q: float, steps: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


def test_figures_and_numbers(tmp_path):
    numbers = accountants.main(["--out", str(tmp_path)])
    assert (tmp_path / "abadi_epsilon_vs_epochs.png").stat().st_size > 10_000
    assert (tmp_path / "dpdropout_sigma_vs_epsilon.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "accountants.json").read_text()) == json.loads(json.dumps(numbers))
    abadi = numbers["abadi"]
    for epochs, rdp, pld in zip(abadi["epochs"][:4], abadi["epsilon"]["rdp"], abadi["epsilon"]["pld"]):
        event = _dpsgd(4.0, 0.01, round(epochs / 0.01))
        reference = _rdp().compose(event).get_epsilon(1e-5)
        assert rdp == pytest.approx(reference, rel=1e-6)
        pld_reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event)
        assert pld == pytest.approx(pld_reference.get_epsilon(1e-5), rel=0.02)
    # the paper's strong-composition recipe claims less than the sound advanced accountant
    assert all(p < a for p, a in zip(abadi["epsilon"]["paper: strong composition"], abadi["epsilon"]["advanced"]))
    dpd = numbers["dpdropout"]
    for epsilon, sigma in zip(dpd["epsilon"], dpd["sigma"]["rdp"]):
        reached = _rdp().compose(_dpsgd(sigma, 0.01, 20_000)).get_epsilon(1e-4)
        assert reached <= epsilon * (1 + 1e-9)
    # the paper's printed zCDP σ (3.23) is far below what a sound accountant needs at ε = 0.5
    assert dpd["paper_printed_sigma_at_epsilon_0.5"]["DPD-zCDP"] < 0.5 * dpd["sigma"]["rdp"][0]
