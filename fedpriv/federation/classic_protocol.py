"""What the classic algorithms' server (``server.classic``) and nodes (``clients.classic.client_app``)
say to each other: record names, the ledger entry of a release, the flat weight vectors
training releases carry, and ``Request``, the node's checked reading of a request.

- QUERY: ``ConfigRecord`` "config" with ``algorithm``, ``run-key``, ``step`` and the
  algorithm's values (``dataset``, ``seed``, ``epsilon``, ...); ``ArrayRecord`` "arrays"
  with its arrays (bounds, centroids, weights, queries, a projection).
- Reply: ``ArrayRecord`` "values" (one flat array "values") and the "privacy" record of
  ``protocol.charge_record`` (entry and events); or an ``Error`` (``protocol``'s codes).

Every value is the server's and untrusted: ``Request``'s readers raise ``ProtocolError``
on anything missing, of the wrong type, or not finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedpriv.algorithms.datasets import LOADERS
from fedpriv.federation.protocol import ProtocolError, check_run_key

CONFIG, ARRAYS, VALUES = "config", "arrays", "values"


def entry(run_key: str, algorithm: str, step: int) -> str:
    """The ledger entry of one release: a node never answers one twice."""
    return f"{check_run_key(run_key)}/{algorithm}/step-{step}"


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    """A model's parameters as one flat vector: what a training release sends."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()


def load_flat_weights(model: torch.nn.Module, weights: np.ndarray) -> torch.nn.Module:
    """``model`` with its parameters set from a flat vector (``flat_weights``' inverse)."""
    torch.nn.utils.vector_to_parameters(torch.as_tensor(weights, dtype=torch.float32), model.parameters())
    return model


@dataclass(frozen=True)
class Request:
    """The server's request as a node reads it: each value checked when it is read."""

    config: ConfigRecord
    arrays: ArrayRecord

    def _value(self, name: str) -> object:
        if name not in self.config:
            raise ProtocolError(f"request lacks {name!r}")
        return self.config[name]

    def array(self, name: str) -> np.ndarray:
        """A finite float array."""
        if name not in self.arrays:
            raise ProtocolError(f"request lacks array {name!r}")
        value = self.arrays[name].numpy().astype(float)
        if not np.all(np.isfinite(value)):
            raise ProtocolError(f"array {name!r} is not finite")
        return value

    def number(self, name: str) -> float:
        """A finite number."""
        value = self._value(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ProtocolError(f"{name} must be a finite number, got {value!r}")
        return float(value)

    def positive(self, name: str) -> float:
        """A finite number > 0."""
        value = self.number(name)
        if value <= 0:
            raise ProtocolError(f"{name} must be > 0, got {value!r}")
        return value

    def integer(self, name: str, low: int = 0) -> int:
        """An integer ≥ ``low``."""
        value = self._value(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProtocolError(f"{name} must be an integer >= {low}, got {value!r}")
        return value

    def text(self, name: str) -> str:
        value = self._value(name)
        if not isinstance(value, str):
            raise ProtocolError(f"{name} must be a string, got {value!r}")
        return value

    @property
    def epsilon(self) -> float:
        return self.positive("epsilon")

    @property
    def dataset(self) -> str:
        name = self.text("dataset")
        if name not in LOADERS:
            raise ProtocolError(f"unknown data set {name!r}")
        return name

    @property
    def seed(self) -> int:
        """The public seed of the data split (which records are train, which test)."""
        return self.integer("seed")

    @property
    def entry(self) -> str:
        return entry(self.text("run-key"), self.text("algorithm"), self.integer("step"))
