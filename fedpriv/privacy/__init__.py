"""Privacy accounting: events, accountants, calibration, the per-client ledger and its
file-locked store.

See docs/architecture.md for the contract and docs/accounting.md for the math.
"""

from fedpriv.privacy.accountants import AccountantKind, UnsupportedEventError, epsilon_of, make_accountant
from fedpriv.privacy.budget import Budget
from fedpriv.privacy.calibration import calibrate_distributed_noise, calibrate_noise_multiplier
from fedpriv.privacy.events import (
    ComposedEvent,
    DistributedDiscreteGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    distributed_dpsgd_event,
    dpsgd_event,
    event_from_dict,
    event_to_dict,
)
from fedpriv.privacy.ledger import BudgetExceededError, PrivacyLedger
from fedpriv.privacy.ledger_json import LedgerError
from fedpriv.privacy.store import LedgerStore

__all__ = [
    "AccountantKind",
    "Budget",
    "BudgetExceededError",
    "ComposedEvent",
    "DistributedDiscreteGaussianEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "LedgerError",
    "LedgerStore",
    "PoissonSampledEvent",
    "PrivacyLedger",
    "SelfComposedEvent",
    "UnsupportedEventError",
    "calibrate_distributed_noise",
    "calibrate_noise_multiplier",
    "distributed_dpsgd_event",
    "dpsgd_event",
    "epsilon_of",
    "event_from_dict",
    "event_to_dict",
    "make_accountant",
]
