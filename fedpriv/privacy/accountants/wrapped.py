"""Adapter from fedpriv events to a dp-accounting ``PrivacyAccountant``.

Events are translated with ``events.to_dp_accounting``; support is checked with the
backend's dry run (``supports``) before anything is composed.
"""

from __future__ import annotations

import dp_accounting

from fedpriv.privacy.accountants.base import Accountant, UnsupportedEventError
from fedpriv.privacy.events import DpEvent, EventError, to_dp_accounting


class DpAccountingAccountant(Accountant[dp_accounting.DpEvent]):
    """An ``Accountant`` backed by a dp-accounting accountant instance."""

    def __init__(self, backend: dp_accounting.PrivacyAccountant) -> None:
        self._backend = backend

    def _prepare(self, event: DpEvent) -> dp_accounting.DpEvent:
        try:
            translated = to_dp_accounting(event)
        except EventError as err:
            raise UnsupportedEventError(f"{self.kind.value} accountant: {err}") from err
        if not self._backend.supports(translated):
            raise UnsupportedEventError(f"{self.kind.value} accountant does not support {event!r}")
        return translated

    def _apply(self, prepared: dp_accounting.DpEvent) -> None:
        self._backend.compose(prepared)

    def _epsilon(self, delta: float) -> float:
        return float(self._backend.get_epsilon(delta))

    def _delta(self, epsilon: float) -> float:
        return float(self._backend.get_delta(epsilon))
