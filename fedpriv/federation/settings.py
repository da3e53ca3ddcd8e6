"""Run settings: Flower's kebab-case ``run_config`` parsed once, at the edge, into a frozen,
keyword-only value of the run's privacy mode: ``LocalSettings``, ``DistributedSettings``,
``CentralUserSettings`` or ``DistributedUserSettings`` (``parse_settings``). ``RunSettings``,
which the apps read, is their union: the keys the mode does not use at their defaults.

Each key is written once, as a field below (``fedpriv.federation.keys.setting``: default,
help, range, what unset means, its flag); the group of fields it sits in says which modes
use it (``USED_BY``). The simulations' flags (``simulations._cli``), ``pyproject.toml``'s
``[tool.flwr.app.config]`` and the docs' tables (``fedpriv.federation.settings_docs``) are
written from them. A key the run's mode does not use, at another value than its default, is
an error, not ignored.

The run config belongs to the server. A client reads it for what the server may decide
(which data partition, the plan) and as a *request* to tighten its own policy
(``client-epsilon-budget``, ``delta``), never to loosen it: budgets, δ, randomness and
what may be released are the node's (``fedpriv.federation.policy``).
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from fedpriv.federation import modes
from fedpriv.federation.keys import AT_LEAST_0, AT_LEAST_1, POSITIVE, UNIT, Bound, Key, SettingsError, setting
from fedpriv.model_names import MODELS

if TYPE_CHECKING:
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

PLAN = "the data set's plan"

EXCLUSIVE = ("target-epsilon", "noise-multiplier")
"""Keys of which a run sets at most one."""


@functools.cache
def _enum_types() -> dict[str, type[StrEnum]]:
    """The enums of the settings by class name. ``Rounding`` and ``LRSchedule`` are imported
    here, when a value is built, not with this module: their packages import torch, and the
    command line reads the definitions before torch loads."""
    lattice = importlib.import_module("fedpriv.distributed.lattice")
    plan = importlib.import_module("fedpriv.training.plan")
    return {e.__name__: e for e in (PrivacyMode, UserNoise, ServerRandomness, Partition, lattice.Rounding,
                                    plan.LRSchedule)}


@functools.cache
def _key(field: Field[Any]) -> Key:
    return Key.of(field)


@dataclass(frozen=True, kw_only=True)
class _Settings:
    """Every mode's keys; each value is in its key's range, its enums are enums."""

    dataset: str = setting("mnist", "the data set (unused with task)", choices=DATASETS, flag=False)
    model: str | None = setting(None, "a fedpriv.models name", unset=PLAN, choices=MODELS, metavar="NAME")
    task: str | None = setting(None, "a user's own model and data: the app's task module (\"task\" for task.py); "
                                     "dataset and model are then unused (docs/own-task.md)", unset="none", flag=False)
    rounds: int = setting(3, "federated rounds", bound=AT_LEAST_1,
                          elsewhere="Flower's templates: num-server-rounds; rounds is the flags' and results.json's")
    min_clients: int = setting(2, "discovery waits for this many nodes (the simulations: --clients)",
                               bound=AT_LEAST_1, flag=False, elsewhere="Flower's strategies: min_available_nodes")
    target_epsilon: float | None = setting(None, "calibrate each client's σ (user level: z) to end at ≤ ε",
                                           bound=POSITIVE, unset="none, a fixed σ")
    delta: float = setting(1e-5, "δ of every guarantee", bound=Bound(low=0, high=1, low_open=True, high_open=True))
    epsilon_budget: float | None = setting(None, "per-client ε budget of the server's ledger", bound=POSITIVE,
                                           unset="target-epsilon, else unlimited")
    client_epsilon_budget: float | None = setting(
        None, "asks every node to tighten its own ε budget to this for the run (a node's policy is only tightened, "
              "never loosened; the simulated nodes take it as their budget)", bound=POSITIVE,
        unset="no request (simulated nodes: epsilon-budget, else target-epsilon, else unlimited)")
    noise_multiplier: float | None = setting(
        None, "fixed σ for every client (user level: z), 0 for no noise", bound=AT_LEAST_0, unset=PLAN,
        unset_as=-1.0, elsewhere="Opacus' noise_multiplier")
    lot_size: int | None = setting(None, "expected Poisson lot size: q = lot / N per client", bound=AT_LEAST_1,
                                   unset=f"{PLAN}'s lot, one shared q = lot / ΣN",
                                   elsewhere="Opacus' expected_batch_size (sample_rate = lot / N)")
    lr: float | None = setting(None, "learning rate", bound=POSITIVE, unset=PLAN)
    lr_schedule: LRSchedule | None = setting(None, "how the LR changes over rounds", unset=PLAN,
                                             choices=("constant", "cosine"))
    max_physical_batch: int | None = setting(
        None, "examples per micro-batch of a lot: memory and speed, never privacy", bound=AT_LEAST_1,
        unset="the most that fit each node's memory, from a measured step", metavar="N",
        elsewhere="Opacus' max_physical_batch_size")
    fraction_evaluate: float = setting(0.0, "fraction of clients asked for a noisy, booked evaluation per round",
                                       bound=UNIT, elsewhere="Flower's fraction_evaluate")
    partition: Partition = setting(Partition.IID, "how the training set is split: iid, dirichlet (Dir(alpha) shares "
                                                  "per label) or shard (2 half-label shards per client)",
                                   choices=tuple(Partition))
    alpha: float = setting(0.5, "Dirichlet concentration", bound=POSITIVE)
    seed: int = setting(0, "seeds the server's sampling and model init, never a node's noise or partition (the "
                           "simulations also seed their nodes' randomness and partition key with it)")
    limit_train: int | None = setting(None, "use the first N training examples", bound=AT_LEAST_1, unset="all")
    limit_test: int | None = setting(None, "use the first N test examples", bound=AT_LEAST_1, unset="all")
    data_dir: str | None = setting(None, "root folder of the server's data sets (each node reads its policy's "
                                         "data-dir)", unset="$XDG_CACHE_HOME/fedpriv or ~/.cache/fedpriv", path=True)
    download: bool = setting(False, "download the data set if it is missing")
    out: str | None = setting(None, "output folder: results.json, ledger.json, the plots; one holding a run's results "
                                    "is refused unless resume", unset="none", path=True)
    state_dir: str | None = setting(None, "the server's durable ledger and checkpoints (the simulations: each "
                                          "node's ledger under nodes/)", unset="this run only", path=True)
    resume: bool = setting(False, "continue the run in state-dir from its last completed round")
    round_timeout: float = setting(3600.0, "seconds a round waits for replies; a later node has failed the round",
                                   bound=POSITIVE)
    accept_failures: bool = setting(True, "aggregate a round although a sampled client refused, failed, timed "
                                          "out or dropped out of a secure sum; false (--no-accept-failures) "
                                          "keeps the previous model then",
                                    elsewhere="Flower's strategies: accept_failures")

    def __post_init__(self) -> None:
        for field in fields(self):
            key, value = _key(field), getattr(self, field.name)
            if key.enum is not None and value is not None:
                try:
                    value = _enum_types()[key.enum](value)
                except ValueError:
                    key.check(value)  # the choices' message
                object.__setattr__(self, field.name, value)
            if value is not None:
                key.check(value)
        self._check()

    def _check(self) -> None:
        """The checks across keys (each group adds its own and calls this)."""
        if self.task is not None and not self.task.isidentifier():
            raise SettingsError(f"task must name a Python module of the app (e.g. \"task\"), got {self.task!r}")
        if self.task is not None and self.model is not None:
            raise SettingsError("task: a user's task brings its own model() (leave model unset)")
        for key, limit in (("limit-train", self.limit_train), ("limit-test", self.limit_test)):
            if self.task is not None and limit is not None:
                raise SettingsError(f"{key}: a user's task chooses its own data (its load_data, on each node's "
                                    "own folder): leave it unset, and take fewer items in load_data")
        if self.target_epsilon is not None and self.noise_multiplier is not None:
            raise SettingsError("give target-epsilon or noise-multiplier, not both")
        if self.resume and not self.state_dir:
            raise SettingsError("resume needs state-dir: the folder of the run to continue")

    @property
    def server_budget(self) -> float:
        """ε budget per client in the server's ledger: ``epsilon-budget`` or the target."""
        return self.epsilon_budget or self.target_epsilon or math.inf


@dataclass(frozen=True, kw_only=True)
class _LocalEpochs(_Settings):
    """Modes whose round trains each node for local epochs (not distributed DP-SGD: one
    secure sum and one server step per round)."""

    local_epochs: int = setting(1, "local epochs per round", bound=AT_LEAST_1,
                                elsewhere="Flower's templates: local-epochs")


@dataclass(frozen=True, kw_only=True)
class _RecordLevel(_Settings):
    """Record-level DP-SGD's modes: per-example clipping, a fraction of clients per round
    (user level clips each client's delta by ``user-clip`` and draws ``cohort`` clients)."""

    max_grad_norm: float | None = setting(
        None, "clipping norm C of each example's gradient", unset=PLAN,
        bound=Bound(low=0, low_open=True, finite=False),  # ∞: user level's plain training plan
        elsewhere="Opacus' max_grad_norm")
    fraction_train: float = setting(1.0, "fraction of clients sampled per round",
                                    bound=Bound(low=0, high=1, low_open=True), elsewhere="Flower's fraction_train")


@dataclass(frozen=True, kw_only=True)
class _SecureSum(_Settings):
    """The secure sum's keys (distributed DP-SGD, distributed user level)."""

    lattice_rounding: Rounding = setting(
        "nearest", "the secure sum's encoding of a clipped contribution: nearest (no random draws) or conditional "
                   "(Kairouz et al.'s conditional randomized rounding)", choices=("nearest", "conditional"))
    secagg_neighbours: int = setting(
        0, "SecAgg+ on a random graph where each node masks with and shares its secrets among only K others (even; "
           "the nodes' policies must accept K), 0 for all others", bound=Bound(low=0, even=True), metavar="K",
        elsewhere="Flower's SecAggPlusWorkflow: num_shares (K + 1)")


@dataclass(frozen=True, kw_only=True)
class _UserLevel(_LocalEpochs):
    """User-level DP-FedAvg's keys (``docs/user-level.md``): a Poisson cohort, each client's
    delta clipped to S, S fixed or adaptive; noise z or calibrated to ``target-epsilon``."""

    cohort: int | None = setting(None, "expected clients per round, Poisson-sampled", bound=AT_LEAST_1,
                                 unset="every client", elsewhere="Flower's DP wrappers: num_sampled_clients")
    user_clip: float = setting(1.0, "S, the bound on each client's model delta (the initial S with clip-quantile)",
                               bound=POSITIVE, elsewhere="Flower's DP wrappers: clipping_norm")
    clip_quantile: float | None = setting(
        None, "adaptive clipping: S follows this quantile of the update norms",
        bound=Bound(low=0, high=1, low_open=True, high_open=True), unset="fixed S",
        elsewhere="Flower's adaptive clipping: target_clipped_quantile")
    clip_lr: float = setting(0.2, "adaptive clipping's step η", bound=POSITIVE,
                             elsewhere="Flower's adaptive clipping: clip_norm_lr")
    clip_count_noise: float | None = setting(None, "σ_b of adaptive clipping's noisy count", bound=POSITIVE,
                                             unset="max(cohort / 20, z)",
                                             elsewhere="Flower's adaptive clipping: clipped_count_stddev")
    clip_warmup_rounds: int = setting(0, "adaptive clipping: the first W rounds release only the noisy count, "
                                         "placing S before the model moves", bound=AT_LEAST_0, metavar="W")
    clip_warmup_lr: float = setting(1.0, "η of S's update in those count-only rounds", bound=POSITIVE)
    server_randomness: ServerRandomness = setting(
        ServerRandomness.SECURE, "where the server draws its cohorts and noise: secure (the OS CSPRNG) or "
                                 "seeded from seed (public: simulations and tests only; the simulations set it)",
        choices=tuple(ServerRandomness), flag=False)

    def _check(self) -> None:
        super()._check()
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise SettingsError("privacy = 'user' needs noise-multiplier (z) or target-epsilon")
        if self.clip_warmup_rounds and self.clip_quantile is None:
            raise SettingsError("clip-warmup-rounds estimates adaptive clipping's S: it needs clip-quantile")
        if self.clip_warmup_rounds and self.clip_warmup_rounds >= self.rounds:
            raise SettingsError(f"clip-warmup-rounds ({self.clip_warmup_rounds}) must leave at least one of the "
                                f"{self.rounds} rounds to train")
        quantile, count_noise, z = self.clip_quantile, self.clip_count_noise, self.noise_multiplier
        if quantile is not None and count_noise is not None and z is not None and not 2 * count_noise > z:
            raise SettingsError(f"clip-count-noise {count_noise} must exceed half the noise multiplier {z}: the "
                                "count estimate would spend the whole round")


@dataclass(frozen=True, kw_only=True)
class LocalSettings(_LocalEpochs, _RecordLevel):
    """``privacy = "local"``: each node's DP-SGD noises its update."""

    mode: ClassVar[str] = modes.LOCAL
    privacy: ClassVar[PrivacyMode] = PrivacyMode.LOCAL
    user_noise: ClassVar[UserNoise] = UserNoise.CENTRAL


@dataclass(frozen=True, kw_only=True)
class DistributedSettings(_SecureSum, _RecordLevel):
    """``privacy = "distributed"``: one DP-SGD step per round on the union, noise shares under secure aggregation."""

    mode: ClassVar[str] = modes.DISTRIBUTED
    privacy: ClassVar[PrivacyMode] = PrivacyMode.DISTRIBUTED
    user_noise: ClassVar[UserNoise] = UserNoise.CENTRAL


@dataclass(frozen=True, kw_only=True)
class CentralUserSettings(_UserLevel):
    """``privacy = "user"``, ``user-noise = "central"``: the server adds the noise."""

    mode: ClassVar[str] = modes.USER_CENTRAL
    privacy: ClassVar[PrivacyMode] = PrivacyMode.USER
    user_noise: ClassVar[UserNoise] = UserNoise.CENTRAL


@dataclass(frozen=True, kw_only=True)
class DistributedUserSettings(_SecureSum, _UserLevel):
    """``privacy = "user"``, ``user-noise = "distributed"``: the clients' noise shares under secure aggregation."""

    mode: ClassVar[str] = modes.USER_DISTRIBUTED
    privacy: ClassVar[PrivacyMode] = PrivacyMode.USER
    user_noise: ClassVar[UserNoise] = UserNoise.DISTRIBUTED

    def _check(self) -> None:
        super()._check()
        if self.clip_quantile is not None and self.target_epsilon is not None:
            raise SettingsError("adaptive clipping (clip-quantile) with user-noise = 'distributed' needs "
                                "noise-multiplier: each round's lattice follows S, so z is not calibrated")


ModeSettings = LocalSettings | DistributedSettings | CentralUserSettings | DistributedUserSettings
MODE_SETTINGS: dict[str, type[ModeSettings]] = {
    cls.mode: cls for cls in (LocalSettings, DistributedSettings, CentralUserSettings, DistributedUserSettings)}


@dataclass(frozen=True, kw_only=True)
class RunSettings(_SecureSum, _UserLevel, _RecordLevel):
    """Every key of every mode: the run's mode (``privacy``, ``user-noise``) and its value,
    the keys it does not use at their defaults. See ``docs/federated.md`` for each key."""

    privacy: PrivacyMode = setting(
        PrivacyMode.LOCAL, "local: each node's DP-SGD noises its update; distributed: nodes add integer noise shares "
                           "under secure aggregation and the server sees only the noisy sum; user: user-level "
                           "DP-FedAvg", choices=tuple(PrivacyMode))
    user_noise: UserNoise = setting(
        UserNoise.CENTRAL, "who adds a user-level round's noise: central (the server, trusted to) or distributed "
                           "(each sampled client a discrete Gaussian share under secure aggregation; the server sees "
                           "only the noisy sum)", choices=tuple(UserNoise))

    def _check(self) -> None:
        """The checks of the run's mode (``mode_settings``), on its keys."""
        if self.user_noise is UserNoise.DISTRIBUTED and self.privacy is not PrivacyMode.USER:
            raise SettingsError("user-noise = 'distributed' is a user-level mode: it needs privacy = 'user'")
        self.mode_settings()

    @property
    def mode(self) -> str:
        """The run's mode (``fedpriv.federation.modes``)."""
        return modes.mode_of(self.privacy, self.user_noise)

    def mode_settings(self) -> ModeSettings:
        """The value of the run's mode: its keys alone."""
        cls = MODE_SETTINGS[self.mode]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    @classmethod
    def of(cls, settings: ModeSettings) -> RunSettings:
        """The union of a mode's value: the keys it does not use at their defaults."""
        return cls(privacy=settings.privacy, user_noise=settings.user_noise,
                   **{f.name: getattr(settings, f.name) for f in fields(settings)})

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """``parse_settings``, as the union."""
        return cls.of(parse_settings(config))


KEYS: dict[str, Key] = {key.name: key for key in map(Key.of, fields(RunSettings))}
"""Every run-config key by name, in the order of the definitions."""

SELECTORS = ("privacy", "user-noise")
"""The keys that choose the mode."""

USED_BY: dict[str, frozenset[str]] = {
    name: used for name in KEYS if name not in SELECTORS
    if (used := frozenset(m for m, cls in MODE_SETTINGS.items() if KEYS[name].attr in cls.__dataclass_fields__))
    != frozenset(modes.MODES)} | {"user-noise": modes.USER}
"""Run-config key → the modes that use it (absent: every mode): the groups of the fields."""

USER_LEVEL_KEYS = tuple(name for name, used in USED_BY.items() if used == modes.USER)
"""The run-config keys of user level alone."""


def used_by(name: str) -> frozenset[str]:
    """The modes that use the key ``name``."""
    return USED_BY.get(name, frozenset(modes.MODES))


def parse_settings(config: Mapping[str, Any]) -> ModeSettings:
    """The run config (kebab-case keys; absent ones at their defaults) as its mode's value.
    ``SettingsError`` for an unknown key (typos must not pass), a bad value, or a key the
    mode does not use set to another value than its default (one line naming both)."""
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise SettingsError(f"unknown run-config keys: {', '.join(unknown)}")
    values = {name: KEYS[name].parse(value) for name, value in config.items()}
    selected = [values.get(name, KEYS[name].default) for name in SELECTORS]
    for name, value in zip(SELECTORS, selected, strict=True):
        KEYS[name].check(value)  # the mode's value holds them only as its class
    mode = modes.mode_of(*selected)
    for name, value in values.items():
        if mode not in used_by(name) and value != KEYS[name].default:
            raise SettingsError(f"{name} = {config[name]!r}: {modes.unused_reason(mode, used_by(name), flags=False)}")
    cls = MODE_SETTINGS[mode]
    return cls(**{KEYS[name].attr: value for name, value in values.items() if name not in SELECTORS
                  and KEYS[name].attr in cls.__dataclass_fields__})
