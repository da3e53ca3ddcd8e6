"""The server's state folder (``state-dir``): its durable ledger and a checkpoint of the
latest run after every completed round, so that ``resume`` continues a killed run.

```
state-dir/ledger.json        every client's spend as the server booked it, across runs
state-dir/checkpoint.json    run key, last completed round, settings, history, the strategy's state
state-dir/model-<key>-<r>.npz  the global model after that round, and the strategy state's arrays
```
The strategy's state is JSON but for its numpy arrays (an optimizer's momentum), which are kept
beside the model, under ``STRATEGY_ARRAYS`` + their key. The model file is written first, then
the checkpoint that names it (each atomically), then the previous model file is removed: a
crash at any point leaves a consistent pair.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from fedpriv.files import write_bytes_atomic, write_json_atomic

CHECKPOINT = "checkpoint.json"
STRATEGY_ARRAYS = "__strategy__/"
"""The prefix of the strategy state's arrays in the model file (no model names a parameter so)."""


class StateError(ValueError):
    """The state folder holds no usable checkpoint for what was asked."""


@dataclass(frozen=True)
class Checkpoint:
    """A run after its last completed round; ``strategy``: what its strategy carries across
    rounds beyond the model (``server.mechanism.Mechanism.state``: nothing in local mode)."""

    run_key: str
    completed_round: int
    settings: dict[str, Any]
    history: dict[str, Any]
    strategy: dict[str, Any] = field(default_factory=dict)


class ServerState:
    """``state-dir``: the ledger's path and the latest run's checkpoint."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    @property
    def ledger_path(self) -> Path:
        return self.folder / "ledger.json"

    def save(self, checkpoint: Checkpoint, arrays: ArrayRecord) -> None:
        """Write the model, then the checkpoint naming it; drop the previous model file."""
        previous = self._model_name()
        name = f"model-{checkpoint.run_key}-{checkpoint.completed_round}.npz"
        buffer = io.BytesIO()
        tensors = {key: value for key, value in checkpoint.strategy.items() if isinstance(value, np.ndarray)}
        named: dict[str, Any] = {**{key: array.numpy() for key, array in arrays.items()},
                                 **{STRATEGY_ARRAYS + key: value for key, value in tensors.items()}}
        np.savez(buffer, **named)
        write_bytes_atomic(self.folder / name, buffer.getvalue())
        strategy = {key: value for key, value in checkpoint.strategy.items() if key not in tensors}
        write_json_atomic(self.folder / CHECKPOINT, {**checkpoint.__dict__, "strategy": strategy, "model": name})
        if previous and previous != name:
            (self.folder / previous).unlink(missing_ok=True)

    def load(self) -> tuple[Checkpoint, ArrayRecord]:
        """The latest checkpoint and its model; ``StateError`` if there is none."""
        path = self.folder / CHECKPOINT
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            with np.load(self.folder / data.pop("model")) as saved:
                arrays = ArrayRecord({key: Array(saved[key]) for key in saved.files
                                      if not key.startswith(STRATEGY_ARRAYS)})
                tensors = {key.removeprefix(STRATEGY_ARRAYS): saved[key] for key in saved.files
                           if key.startswith(STRATEGY_ARRAYS)}
            checkpoint = Checkpoint(**data)
            return dataclasses.replace(checkpoint, strategy={**checkpoint.strategy, **tensors}), arrays
        except FileNotFoundError as err:
            raise StateError(f"nothing to resume in {self.folder}: {err.filename} is missing") from err
        except (OSError, KeyError, TypeError, ValueError) as err:
            raise StateError(f"unreadable checkpoint in {self.folder}: {err}") from err

    def _model_name(self) -> str | None:
        try:
            return json.loads((self.folder / CHECKPOINT).read_text(encoding="utf-8"))["model"]
        except (OSError, ValueError, KeyError):
            return None

