"""Accountants behind one interface, selected by ``make_accountant(kind)``.

======== ============================================================ =====================
kind     math                                                         sampled Gaussian
======== ============================================================ =====================
rdp      Rényi DP / moments accountant (dp-accounting)                 tight (amplified)
pld      privacy loss distributions (dp-accounting)                    tightest
zcdp     ρ-zCDP, ε = ρ + 2√(ρ log 1/δ)                                 no amplification
advanced Dwork–Rothblum–Vadhan advanced composition + amplification    loose
basic    ε and δ add up, + amplification                               loosest
======== ============================================================ =====================
"""

from __future__ import annotations

from collections.abc import Callable

from fedpriv.privacy.accountants.advanced import AdvancedAccountant
from fedpriv.privacy.accountants.base import Accountant, AccountantKind, UnsupportedEventError
from fedpriv.privacy.accountants.basic import BasicAccountant
from fedpriv.privacy.accountants.pld import PldAccountant
from fedpriv.privacy.accountants.rdp import RdpAccountant
from fedpriv.privacy.accountants.zcdp import ZcdpAccountant
from fedpriv.privacy.events import DpEvent

_FACTORIES: dict[AccountantKind, Callable[[], Accountant]] = {
    AccountantKind.RDP: RdpAccountant,
    AccountantKind.PLD: PldAccountant,
    AccountantKind.ZCDP: ZcdpAccountant,
    AccountantKind.ADVANCED: AdvancedAccountant,
    AccountantKind.BASIC: BasicAccountant,
}


def make_accountant(kind: AccountantKind | str = AccountantKind.RDP) -> Accountant:
    """A fresh, empty accountant of ``kind`` (an ``AccountantKind`` or its string)."""
    return _FACTORIES[AccountantKind(kind)]()


def epsilon_of(event: DpEvent, delta: float, accountant: AccountantKind | str = AccountantKind.RDP) -> float:
    """ε of ``event`` alone at ``delta`` under a fresh accountant of kind ``accountant``."""
    return make_accountant(accountant).compose(event).epsilon(delta)


__all__ = [
    "Accountant",
    "AccountantKind",
    "AdvancedAccountant",
    "BasicAccountant",
    "PldAccountant",
    "RdpAccountant",
    "UnsupportedEventError",
    "ZcdpAccountant",
    "epsilon_of",
    "make_accountant",
]
