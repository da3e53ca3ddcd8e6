"""Run settings: Flower's kebab-case ``run_config`` parsed once into a frozen dataclass.

The same keys are ``[tool.flwr.app.config]`` in ``pyproject.toml`` (defaults for
``flwr run .``), ``--run-config`` overrides, and the flags of ``python -m simulations.*``
(``--local-epochs`` ↔ ``local-epochs``). TOML has no null, so "unset" is spelled
``0`` (or ``-1`` for the noise multiplier, where 0 means non-private) or ``""``.

The run config belongs to the server. A client reads it for what the server may decide
(which data partition, the plan) and as a *request* to tighten its own policy
(``client-epsilon-budget``, ``delta``), never to loosen it: budgets, δ, randomness and
what may be released are the node's (``fedpriv.federation.policy``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fedpriv.distributed.lattice import Rounding
from fedpriv.training import LRSchedule


class PrivacyMode(StrEnum):
    """Whose noise protects what (``docs/distributed.md``, ``docs/user-level.md``).

    - ``local``: record-level DP-SGD on each node; every update leaves noised (the default).
    - ``distributed``: record-level DP-SGD on the union; each node adds a share of integer
      noise under secure aggregation, the server sees only the noisy sum.
    - ``user``: user-level DP-FedAvg: whole clients protected (central or distributed noise).
    """

    LOCAL = "local"
    DISTRIBUTED = "distributed"
    USER = "user"


class UserNoise(StrEnum):
    """Who adds a user-level round's noise (``docs/user-level.md``).

    - ``central``: the server, trusted to (the default).
    - ``distributed``: each sampled client adds a discrete Gaussian share to its encoded
      delta under secure aggregation; the server sees only the noisy sum.
    """

    CENTRAL = "central"
    DISTRIBUTED = "distributed"


class ServerRandomness(StrEnum):
    """Where a central user-level server draws its cohorts and noise (``docs/user-level.md``).

    - ``secure``: the OS CSPRNG (the default).
    - ``seeded``: from the run's ``seed``, reproducible; whoever knows the run config (it is
      public) can strip the noise: for simulations and tests only.
    """

    SECURE = "secure"
    SEEDED = "seeded"


class Partition(StrEnum):
    """How a node's data set is split into shares (``fedpriv.federation.partition``: a keyed rule per record)."""

    IID = "iid"
    DIRICHLET = "dirichlet"
    SHARD = "shard"


DATASETS = ("mnist", "cifar10")


class SettingsError(ValueError):
    """A run-config value is missing, mistyped or out of range."""


@dataclass(frozen=True)
class RunSettings:
    """Everything a fedpriv run needs; see ``docs/federated.md`` for each key."""

    dataset: str = "mnist"
    model: str | None = None
    task: str | None = None
    rounds: int = 3
    min_clients: int = 2
    local_epochs: int = 1
    target_epsilon: float | None = None
    delta: float = 1e-5
    epsilon_budget: float | None = None
    client_epsilon_budget: float | None = None
    noise_multiplier: float | None = None
    lot_size: int | None = None
    max_grad_norm: float | None = None
    lr: float | None = None
    lr_schedule: LRSchedule | None = None
    max_physical_batch: int | None = None
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0
    partition: Partition = Partition.IID
    alpha: float = 0.5
    seed: int = 0
    limit_train: int | None = None
    limit_test: int | None = None
    data_dir: str | None = None
    download: bool = False
    out: str | None = None
    state_dir: str | None = None
    resume: bool = False
    round_timeout: float = 3600.0
    accept_failures: bool = True
    privacy: PrivacyMode = PrivacyMode.LOCAL
    lattice_rounding: Rounding = Rounding.NEAREST
    secagg_neighbours: int = 0
    cohort: int | None = None
    user_clip: float = 1.0
    clip_quantile: float | None = None
    clip_lr: float = 0.2
    clip_count_noise: float | None = None
    clip_warmup_rounds: int = 0
    clip_warmup_lr: float = 1.0
    server_randomness: ServerRandomness = ServerRandomness.SECURE
    user_noise: UserNoise = UserNoise.CENTRAL

    def __post_init__(self) -> None:
        self._check_task()
        if self.dataset not in DATASETS:
            raise SettingsError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        for name in ("rounds", "local_epochs", "min_clients"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name.replace('_', '-')} must be >= 1")
        if not 0 < self.delta < 1:
            raise SettingsError(f"delta must be in (0, 1), got {self.delta}")
        for name in ("target_epsilon", "epsilon_budget", "client_epsilon_budget"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SettingsError(f"{name.replace('_', '-')} must be finite and > 0, got {value}")
        if self.target_epsilon is not None and self.noise_multiplier is not None:
            raise SettingsError("give target-epsilon or noise-multiplier, not both")
        if self.noise_multiplier is not None and self.noise_multiplier < 0:
            raise SettingsError("noise-multiplier must be >= 0")
        if not 0 < self.fraction_train <= 1:
            raise SettingsError(f"fraction-train must be in (0, 1], got {self.fraction_train}")
        if not 0 <= self.fraction_evaluate <= 1:
            raise SettingsError(f"fraction-evaluate must be in [0, 1], got {self.fraction_evaluate}")
        if self.max_physical_batch is not None and self.max_physical_batch < 1:
            raise SettingsError(f"max-physical-batch must be >= 1 (0: chosen to fit each node's memory), "
                                f"got {self.max_physical_batch}")
        if self.alpha <= 0:
            raise SettingsError(f"alpha must be > 0, got {self.alpha}")
        if self.resume and not self.state_dir:
            raise SettingsError("resume needs state-dir: the folder of the run to continue")
        self._check_user_level()
        self._check_distributed()
        if not (math.isfinite(self.round_timeout) and self.round_timeout > 0):
            raise SettingsError(f"round-timeout must be finite and > 0 seconds, got {self.round_timeout}")

    def _check_task(self) -> None:
        """A user's task (``fedpriv.task``) names a module, and brings its own model and data."""
        if self.task is not None and not self.task.isidentifier():
            raise SettingsError(f"task must name a Python module of the app (e.g. \"task\"), got {self.task!r}")
        if self.task is not None and self.model is not None:
            raise SettingsError("task: a user's task brings its own model() (leave model unset)")
        for key, limit in (("limit-train", self.limit_train), ("limit-test", self.limit_test)):
            if self.task is not None and limit is not None:
                raise SettingsError(f"{key}: a user's task chooses its own data (its load_data, on each node's "
                                    "own folder): leave it unset, and take fewer items in load_data")

    def _check_distributed(self) -> None:
        """SecAgg+'s neighbours per node are 0 (the full graph) or even (a Harary graph)."""
        if self.secagg_neighbours < 0 or self.secagg_neighbours % 2:
            raise SettingsError(f"secagg-neighbours must be 0 (the full graph) or even, got {self.secagg_neighbours}")

    def _check_user_level(self) -> None:
        """The user-level keys (``docs/user-level.md``) are in range."""
        if self.cohort is not None and self.cohort < 1:
            raise SettingsError(f"cohort must be >= 1 (0: every client), got {self.cohort}")
        for name in ("user_clip", "clip_lr", "clip_count_noise", "clip_warmup_lr"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SettingsError(f"{name.replace('_', '-')} must be finite and > 0, got {value}")
        if self.clip_quantile is not None and not 0 < self.clip_quantile < 1:
            raise SettingsError(f"clip-quantile must be in (0, 1) (0: fixed clipping), got {self.clip_quantile}")
        if self.privacy is PrivacyMode.USER and self.noise_multiplier is None and self.target_epsilon is None:
            raise SettingsError("privacy = 'user' needs noise-multiplier (z) or target-epsilon")
        if self.user_noise is UserNoise.DISTRIBUTED and self.privacy is not PrivacyMode.USER:
            raise SettingsError("user-noise = 'distributed' is a user-level mode: it needs privacy = 'user'")
        if self.user_noise is UserNoise.DISTRIBUTED and self.clip_quantile is not None \
                and self.target_epsilon is not None:
            raise SettingsError("adaptive clipping (clip-quantile) with user-noise = 'distributed' needs "
                                "noise-multiplier: each round's lattice follows S, so z is not calibrated")
        self._check_warmup()
        quantile, count_noise, z = self.clip_quantile, self.clip_count_noise, self.noise_multiplier
        if quantile is not None and count_noise is not None and z is not None and not 2 * count_noise > z:
            raise SettingsError(f"clip-count-noise {self.clip_count_noise} must exceed half the noise multiplier "
                                f"{self.noise_multiplier}: the count estimate would spend the whole round")

    def _check_warmup(self) -> None:
        """Count-only rounds (``clip-warmup-rounds``) place adaptive clipping's S before the
        model moves: they need user level with a quantile, and leave a round to train."""
        if self.clip_warmup_rounds < 0:
            raise SettingsError(f"clip-warmup-rounds must be >= 0, got {self.clip_warmup_rounds}")
        if not self.clip_warmup_rounds:
            return
        if self.privacy is not PrivacyMode.USER or self.clip_quantile is None:
            raise SettingsError("clip-warmup-rounds estimates adaptive clipping's S: it needs privacy = 'user' and "
                                "clip-quantile")
        if self.clip_warmup_rounds >= self.rounds:
            raise SettingsError(f"clip-warmup-rounds ({self.clip_warmup_rounds}) must leave at least one of the "
                                f"{self.rounds} rounds to train")

    @property
    def server_budget(self) -> float:
        """ε budget per client in the server's ledger: ``epsilon-budget`` or the target."""
        return self.epsilon_budget or self.target_epsilon or math.inf

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """Parse kebab-case keys; unknown keys are an error (typos must not pass)."""
        fields = {f.replace("_", "-"): f for f in cls.__dataclass_fields__}
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise SettingsError(f"unknown run-config keys: {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in config.items():
            kwargs[fields[key]] = _parse(fields[key], value)
        return cls(**kwargs)


_UNSET_IF_ZERO = {
    "target_epsilon", "epsilon_budget", "client_epsilon_budget", "lot_size",
    "max_grad_norm", "lr", "limit_train", "limit_test", "max_physical_batch",
    "cohort", "clip_quantile", "clip_count_noise",
}
_INTS = {"rounds", "min_clients", "local_epochs", "lot_size", "seed", "limit_train", "limit_test",
         "max_physical_batch", "cohort", "secagg_neighbours", "clip_warmup_rounds"}


_ENUMS: dict[str, type[StrEnum]] = {"partition": Partition, "privacy": PrivacyMode,
                                     "server_randomness": ServerRandomness, "lattice_rounding": Rounding,
                                     "user_noise": UserNoise}


def _parse(field: str, value: Any) -> Any:
    """One run-config value to its field's type, mapping TOML sentinels to ``None``."""
    try:
        if field in _ENUMS:
            return _ENUMS[field](value)
        if field == "lr_schedule":
            return LRSchedule(value) if value else None
        if field in ("data_dir", "out", "state_dir"):
            return str(value) or None
        if field in ("model", "task"):
            return str(value) or None
        if field == "dataset":
            return str(value)
        if field in ("download", "resume", "accept_failures"):
            if not isinstance(value, bool):
                raise TypeError
            return value
        if field in _INTS:
            if isinstance(value, bool) or int(value) != value:
                raise TypeError
            number: float = int(value)
        else:
            number = float(value)
    except (TypeError, ValueError) as err:
        raise SettingsError(f"{field.replace('_', '-')}: bad value {value!r}") from err
    if field == "noise_multiplier":
        return None if number < 0 else number
    if field in _UNSET_IF_ZERO and number == 0:
        return None
    return number
