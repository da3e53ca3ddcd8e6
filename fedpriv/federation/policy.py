"""A node's privacy policy: what its operator promises the data owner, whatever the server asks.

The server owns the run config; the node owns this. It is read from the SuperNode's
``--node-config`` (its operator's command line) and from a TOML policy file named there
(``policy = "/etc/fedpriv/policy.toml"``) or by the environment variable
``FEDPRIV_NODE_POLICY`` (how a simulation sets the policy of the nodes it simulates);
``--node-config`` keys win over the file's. Nothing here can come from the server.

Keys (kebab-case, as in ``--node-config``):

- ``epsilon-budget`` (required): the node's total ε over all runs, at ``delta``.
  ``inf`` is accepted only when written out: an operator's explicit choice.
- ``state-dir`` (required): where the durable ledger lives (``{partition-id}`` is expanded).
  A relative ``state-dir`` or ``data-dir`` in a policy file is taken relative to that file's
  own folder (once, when it is read: the same policy started from two folders keeps one
  ledger); in ``--node-config``, which has no folder, it must be absolute (or start with ``~``).
  Before it answers anything, a node checks the ledger there is the one it was initialised
  with (``python -m fedpriv.node init``; see ``fedpriv.node``).
- ``delta`` (default 1e-5).
- ``randomness``: ``secure`` (default; lots and noise from the OS CSPRNG) or ``seeded``
  with ``seed``: reproducible for whoever knows the seed — weaker, since the seed's holder
  can regenerate and subtract the noise. Seeded streams are mixed with the run id, the
  round and the node's count of earlier ledger entries, so no two trainings repeat a draw.
- ``public-num-examples`` (default false): the local data set size N may be sent as is.
  Otherwise N leaves only as a Gaussian count of std ``num-examples-noise`` (records),
  booked as ``GaussianEvent(num-examples-noise)`` (sensitivity 1: add/remove one record).
- ``allow-evaluate`` (default false): answer EVALUATE with a discrete Gaussian release of
  (count, correct, clipped loss sum) of std ``evaluate-noise`` (records; the loss sum in
  units of ``LOSS_CLIP``, snapped per record to ``LOSS_STEPS`` steps), booked per answer as
  ``evaluate_event`` (``fedpriv.mechanisms.gaussian``). Needs an accountant that prices the
  discrete Gaussian (``rdp``, ``zcdp``); ``evaluate-noise`` is at most 2^20.
- ``accountant`` (default ``rdp``): how the node's ledger composes its events.
- ``partition-key`` (integer, default 0): keys which records of ``data-dir`` make up the
  node's partition ``partition-id`` of ``num-partitions`` (``fedpriv.federation.partition``: a rule per
  record, so another record added or removed moves no one; the run config's seed is never used).
- ``data-dir``: the root folder of the node's data sets, read by the ClientApp (MNIST,
  CIFAR-10: training and evaluation) and by the classic app's ``dppca`` kinds; default
  ``~/.cache/fedpriv``. A folder named in a request or the run config is never read, and
  nothing is downloaded: which data a node holds is its own.
- ``allow-distributed`` (default false): take part in distributed-DP rounds
  (``privacy = "distributed"``, and user level with ``user-noise = "distributed"``): the
  node adds a share of integer noise to its contribution and sends it only through secure
  aggregation. ``min-cohort`` (default 2) is the fewest nodes it will aggregate with,
  ``max-dropouts`` and ``max-colluders`` (default 0 each) how many of them may drop out
  after masking or collude with the server. The node sizes its
  noise share so that the ``min-cohort − max-dropouts − max-colluders`` honest survivors
  it is guaranteed already carry the whole noise, and books that worst case
  (``honest_shares``), whatever cohort the server claims.
- ``min-secagg-neighbours`` (default: none): the node accepts SecAgg+ on a sparse graph
  (run config ``secagg-neighbours``: it masks against and shares its secrets with only that
  many neighbours) with at least this many neighbours. None demands the full graph: every
  other cohort member a neighbour. Sparse graphs trust the server to draw the graph at
  random (``docs/threat-model.md``).
- Whom a distributed round's cohort is made of (``docs/threat-model.md``, "Distributed DP
  against a malicious server"); a node counts a peer toward its honest cohort only if it
  can verify it:

  - ``secagg-ca`` (a consortium CA's certificate, PEM) and ``secagg-identity`` (a folder with
    the node's ``identity.pem`` and ``identity.key``, certified by that CA:
    ``python -m fedpriv.certificates consortium``): each peer's secure-aggregation keys must
    be signed by a distinct identity the CA certifies, else the node refuses the round. The
    node books ``honest_shares`` of such peers.
  - ``trust-server-cohort = true`` (semi-honest, declared): no CA; the node takes the keys the
    server relays as distinct nodes and books ``honest_shares`` anyway. A server that makes
    up keys (Sybils) breaks this node's ε: the run summary says the node booked under this.
  - neither: ``uncertified-cohort`` says what the node does: ``refuse`` (default) every
    distributed round, or ``own-share``: take part, its own noise share alone carrying the
    round's whole noise (``honest_shares`` = 1: the worst case it can verify).

  ``{partition-id}`` is expanded in both paths; relative paths follow the policy file's folder.
- ``allow-central-user`` (default false): take part in central user-level rounds
  (``privacy = "user"``, ``user-noise = "central"``): the node sends its clipped model
  delta *without noise* and trusts the server to add the noise it names; it books
  ``participant_event(z)`` for the z the server says it adds (``docs/user-level.md``).
  Off, the node refuses such rounds.
- ``min-user-noise-multiplier`` (default: none): the smallest z this node accepts in a
  central user-level round, so that what it trusts the server with is bounded: a round
  naming a smaller z, or a count-only round whose σ_b is below half of it (the same cost to
  its records: ``GaussianEvent(σ_b)`` against ``GaussianEvent(z/2)``), is refused before
  anything is booked. None: any z the server names (the node then books z/2 for it).
- ``trusted-apps``: SHA-256 digests of the app bundles (FABs) the node runs, comma-separated
  (a list in a policy file). Enforced by ``fedpriv-clientapp`` (``clients.pinned``), which a
  deployed SuperNode runs in place of ``flwr-clientapp``: code from any other bundle never
  starts. Empty (the default) there means *no* app is trusted.

The run config may only *tighten*: ``client-epsilon-budget`` and ``delta`` of a run lower
the node's ε and δ for that run's checks (``effective_budget``).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from fedpriv.federation.settings import RunSettings
from fedpriv.mechanisms.gaussian import discrete_gaussian_event
from fedpriv.privacy import AccountantKind, Budget, GaussianEvent
from fedpriv.privacy.events import DpEvent

POLICY_ENV = "FEDPRIV_NODE_POLICY"
"""Environment variable naming a node's policy file (used by the simulations)."""

EVALUATE_SENSITIVITY = math.sqrt(3)
"""L2 sensitivity of an evaluation's (count, correct, loss sum / LOSS_CLIP): each ≤ 1."""

LOSS_CLIP = 10.0
"""Per-example loss is clipped to [0, LOSS_CLIP] before it is summed and released."""

LOSS_STEPS = 2**20
"""A record's clipped loss is snapped to the lattice (LOSS_CLIP / LOSS_STEPS)·ℤ and the loss
sum released in those steps: an integer, like the counts (no double's low bits leave)."""

EVALUATE_UNITS = (1, 1, LOSS_STEPS)
"""How far one record moves each released integer of an evaluation: count, correct, loss steps."""

MISSING_HELP = (
    "set it in the SuperNode's --node-config (e.g. --node-config \"epsilon-budget=2.0 "
    "state-dir='/var/lib/fedpriv/node0' partition-id=0 num-partitions=2\") or in a policy "
    f"file named by policy='...' or ${POLICY_ENV}; see docs/threat-model.md"
)


class PolicyError(ValueError):
    """The node's policy is missing a required key or holds a bad value."""


class UncertifiedCohort(StrEnum):
    """What a node without a consortium CA does in a distributed round (module docstring)."""

    REFUSE = "refuse"
    OWN_SHARE = "own-share"


class SecAggTrust(StrEnum):
    """The trust model a node books a distributed round under (``NodePolicy.secagg_trust``)."""

    CONSORTIUM_CA = "consortium-ca"
    SERVER_COHORT = "trust-server-cohort"
    OWN_SHARE = "own-share"
    REFUSE = "refuse"

    @property
    def described(self) -> str:
        """The model with what it means, as a run summary says it."""
        return {
            SecAggTrust.CONSORTIUM_CA: "consortium-ca (peers certified by the nodes' own CA: holds against a "
                                       "malicious server up to max-colluders)",
            SecAggTrust.SERVER_COHORT: "trust-server-cohort (semi-honest, declared: a server that makes up peers "
                                       "breaks the booked ε)",
            SecAggTrust.OWN_SHARE: "own-share (no CA: each node's share alone carries the whole noise)",
            SecAggTrust.REFUSE: "refuse (no CA: distributed rounds refused)",
        }[self]


class Randomness(StrEnum):
    """Where a node's lots and noise come from (see the module docstring)."""

    SECURE = "secure"
    SEEDED = "seeded"


@dataclass(frozen=True)
class NodePolicy:
    """The node's own privacy policy; see the module docstring for each key."""

    epsilon_budget: float
    state_dir: Path
    delta: float = 1e-5
    randomness: Randomness = Randomness.SECURE
    seed: int | None = None
    public_num_examples: bool = False
    num_examples_noise: float = 20.0
    allow_evaluate: bool = False
    evaluate_noise: float = 20.0
    accountant: AccountantKind = AccountantKind.RDP
    trusted_apps: tuple[str, ...] = ()
    data_dir: Path | None = None
    partition_key: int = 0
    allow_distributed: bool = False
    min_cohort: int = 2
    max_dropouts: int = 0
    max_colluders: int = 0
    min_secagg_neighbours: int | None = None
    allow_central_user: bool = False
    min_user_noise_multiplier: float | None = None
    # distributed DP's cohort: whom the node counts (module docstring)
    secagg_ca: Path | None = None
    secagg_identity: Path | None = None
    trust_server_cohort: bool = False
    uncertified_cohort: UncertifiedCohort = UncertifiedCohort.REFUSE
    policy_file: Path | None = field(default=None, compare=False)
    """The policy file it was read from (not a key): its ledger's identity is recorded beside it."""

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon_budget, (int, float)) and self.epsilon_budget > 0):
            raise PolicyError(f"epsilon-budget must be > 0, got {self.epsilon_budget!r}")
        if not 0 < self.delta < 1:
            raise PolicyError(f"delta must be in (0, 1), got {self.delta!r}")
        for name in ("num_examples_noise", "evaluate_noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PolicyError(f"{name.replace('_', '-')} must be finite and > 0, got {value!r}")
        self._check_evaluate()
        self._check_user_noise_floor()
        if self.min_cohort < 1 or self.max_dropouts < 0 or self.max_colluders < 0:
            raise PolicyError("min-cohort must be >= 1 and max-dropouts, max-colluders >= 0")
        if self.min_secagg_neighbours is not None and self.min_secagg_neighbours < 1:
            raise PolicyError(f"min-secagg-neighbours must be >= 1, got {self.min_secagg_neighbours}")
        if (self.secagg_ca is None) != (self.secagg_identity is None):
            raise PolicyError("secagg-ca and secagg-identity go together: the CA and this node's identity under it")
        if self.secagg_ca is not None and self.trust_server_cohort:
            raise PolicyError("trust-server-cohort declares that there is no consortium CA; this policy names one "
                              "(secagg-ca): set one or the other")
        if self.min_cohort - self.max_dropouts - self.max_colluders < 1:
            raise PolicyError(f"min-cohort ({self.min_cohort}) must exceed max-dropouts + max-colluders "
                              f"({self.max_dropouts} + {self.max_colluders}): no honest survivor would be left")
        if (self.randomness is Randomness.SEEDED) != (self.seed is not None):
            raise PolicyError("randomness = 'seeded' needs a seed, and a seed needs randomness = 'seeded'")

    def _check_user_noise_floor(self) -> None:
        """``min-user-noise-multiplier``, where set, is a finite z > 0."""
        floor = self.min_user_noise_multiplier
        if floor is not None and not (math.isfinite(floor) and floor > 0):
            raise PolicyError(f"min-user-noise-multiplier must be finite and > 0, got {floor!r}")

    def _check_evaluate(self) -> None:
        """An evaluation's discrete Gaussian can be drawn and priced by the node's accountant."""
        try:
            self.evaluate_event()
        except ValueError as err:
            raise PolicyError(f"evaluate-noise: {err}") from err
        if self.allow_evaluate and self.accountant not in (AccountantKind.RDP, AccountantKind.ZCDP):
            raise PolicyError(f"allow-evaluate needs accountant 'rdp' or 'zcdp': '{self.accountant.value}' cannot "
                              "price the discrete Gaussian an evaluation releases")

    @property
    def budget(self) -> Budget:
        """The node's own (ε, δ)."""
        return Budget(epsilon=self.epsilon_budget, delta=self.delta)

    def effective_budget(self, settings: RunSettings) -> Budget:
        """The budget for a run's checks: the node's, tightened (never loosened) by the run."""
        epsilon = min(self.epsilon_budget, settings.client_epsilon_budget or math.inf)
        return Budget(epsilon=epsilon, delta=min(self.delta, settings.delta))

    @property
    def secagg_trust(self) -> SecAggTrust:
        """The trust model of this node's distributed rounds (module docstring)."""
        if self.secagg_ca is not None:
            return SecAggTrust.CONSORTIUM_CA
        if self.trust_server_cohort:
            return SecAggTrust.SERVER_COHORT
        return SecAggTrust(self.uncertified_cohort.value)

    @property
    def honest_shares(self) -> int:
        """Noise shares a distributed round is guaranteed to hold: the honest survivors of the
        smallest cohort this node aggregates with, or its own share alone where it cannot
        verify its peers (``own-share``)."""
        if self.secagg_trust is SecAggTrust.OWN_SHARE:
            return 1
        return self.min_cohort - self.max_dropouts - self.max_colluders

    @property
    def min_survivors(self) -> int:
        """Fewest survivors this node lets a distributed round unmask."""
        return self.min_cohort - self.max_dropouts

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / "ledger.json"

    @property
    def releases_path(self) -> Path:
        """Released values that may be sent again at no cost (the DP count of N)."""
        return self.state_dir / "releases.json"

    def num_examples_event(self) -> DpEvent:
        """What one release of the DP count of N costs."""
        return GaussianEvent(self.num_examples_noise)

    def evaluate_event(self) -> DpEvent:
        """What one answered EVALUATE costs: the discrete Gaussian of std ``evaluate-noise``
        per unit of each released integer (L2 sensitivity √3 in those units)."""
        return discrete_gaussian_event(self.evaluate_noise, EVALUATE_UNITS)


_KEYS = {f.name.replace("_", "-"): f.name for f in fields(NodePolicy) if f.name != "policy_file"}
_KEYS["policy"] = "policy"
_PATHS = ("state-dir", "data-dir", "secagg-ca", "secagg-identity")


def load_policy(node_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> NodePolicy:
    """The node's policy from ``--node-config`` and its policy file; ``PolicyError`` saying
    what to set when a required key is missing (the node then refuses: fail closed)."""
    path = node_config.get("policy") or environ.get(POLICY_ENV)
    values: dict[str, Any] = {}
    policy_file = None
    if path:
        try:
            from_file = tomllib.loads(Path(str(path)).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise PolicyError(f"cannot read the node policy file {str(path)!r}: {err}") from err
        unknown = sorted(set(from_file) - set(_KEYS))
        if unknown:
            raise PolicyError(f"unknown keys in the node policy file {str(path)!r}: {', '.join(unknown)}")
        policy_file = Path(str(path)).expanduser().resolve()
        for key in _PATHS:  # relative to the file's folder, never to the working directory
            if isinstance(from_file.get(key), str) and from_file[key]:
                from_file[key] = str(policy_file.parent / Path(from_file[key]).expanduser())
        values.update(from_file)
    values.update({k: v for k, v in node_config.items() if k in _KEYS and k != "policy"})
    for required in ("epsilon-budget", "state-dir"):
        if required not in values or values[required] in ("", None):
            raise PolicyError(f"this node has no '{required}' in its privacy policy, so it refuses to "
                              f"train or release anything: {MISSING_HELP}")
    return NodePolicy(**{_KEYS[k]: _parse(_KEYS[k], v, node_config) for k, v in values.items()},
                      policy_file=policy_file)


def policy_file_text(values: Mapping[str, Any]) -> str:
    """A policy file (flat TOML) holding ``values``: str, bool, int, float (inf too) or a
    list of str."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isinf(v):
            return "inf"
        return json.dumps(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in values.items())


def _parse(name: str, value: Any, node_config: Mapping[str, Any]) -> Any:
    """One policy value to its field's type; ``PolicyError`` on a bad one."""
    if name in ("state_dir", "data_dir", "secagg_ca", "secagg_identity") and str(value):
        return _absolute(name, str(value), node_config)
    try:
        if name in ("data_dir", "secagg_ca", "secagg_identity"):
            return None
        if name == "uncertified_cohort":
            return UncertifiedCohort(value)
        if name == "randomness":
            return Randomness(value)
        if name == "accountant":
            return AccountantKind(value)
        if name == "trusted_apps":
            return _digests(value)
        if name in ("public_num_examples", "allow_evaluate", "allow_distributed", "allow_central_user",
                    "trust_server_cohort"):
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise TypeError
            return value
        if name in ("seed", "partition_key", "min_cohort", "max_dropouts", "max_colluders", "min_secagg_neighbours"):
            if isinstance(value, bool) or int(value) != float(value):
                raise TypeError
            return int(value)
        number = float(value)
        if math.isnan(number):
            raise ValueError
        return number
    except (TypeError, ValueError) as err:
        raise PolicyError(f"node policy: bad value {value!r} for '{name.replace('_', '-')}'") from err


def _absolute(name: str, value: str, node_config: Mapping[str, Any]) -> Path:
    """A folder of the policy, ``{partition-id}`` expanded; ``PolicyError`` where it is relative
    (it would follow the working directory: two ledgers for one node)."""
    key = name.replace("_", "-")
    if "{partition-id}" in value:
        if "partition-id" not in node_config:
            raise PolicyError(f"node policy: '{key}' names {{partition-id}} but the node has no partition-id")
        value = value.replace("{partition-id}", str(node_config["partition-id"]))
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise PolicyError(f"node policy: '{key}' must be an absolute path (or one relative to its policy file's "
                          "folder): a relative one would follow the working directory")
    return path.resolve()


def _digests(value: Any) -> tuple[str, ...]:
    """SHA-256 hex digests from a comma-separated string or a list of strings."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise TypeError
    digests = tuple(i.strip().lower() for i in items if i.strip())
    if not all(len(d) == 64 and set(d) <= set("0123456789abcdef") for d in digests):
        raise ValueError
    return digests
