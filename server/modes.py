"""The privacy modes as parts of the one round loop: for each mode, the settings its clients'
plans are assigned from and how its ``Mechanism`` is built (``MODES``).

- ``local``: each client's own DP-SGD plan (``server.local``);
- ``distributed``: σ calibrated once for the cohort (``server.distributed.setup``), not per
  client; one secure sum and one server step per round;
- ``user`` with ``user-noise = "central"``: plans without per-example noise
  (``server.userlevel.training_settings``), the server's noise (``server.userlevel``);
- ``user`` with ``user-noise = "distributed"``: the same plans, the clients' noise shares
  under secure aggregation (``server.userlevel_distributed``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedpriv.federation.settings import PrivacyMode, RunSettings, UserNoise
from fedpriv.privacy.events import DpEvent
from fedpriv.task import run_model
from fedpriv.training import TrainingPlan
from server import distributed
from server.assign import Assignment
from server.distributed import DistributedDpSgd
from server.local import LocalDpSgd
from server.mechanism import Mechanism
from server.userlevel import UserLevel, training_settings
from server.userlevel_distributed import DistributedUserLevel


@dataclass(frozen=True)
class Start:
    """What a mode's mechanism is built from: the run's settings, the discovered nodes, the
    run's plan, the nodes' earlier releases and, resuming, the checkpoint's mode state."""

    settings: RunSettings
    nodes: Mapping[int, Assignment]
    plan: TrainingPlan
    releases: Sequence[tuple[DpEvent, ...]] = ()
    resumed: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Mode:
    """A privacy mode: the settings its plans are assigned from, and its mechanism."""

    assigned_settings: Callable[[RunSettings], RunSettings]
    mechanism: Callable[[Start], Mechanism]


def _local(start: Start) -> Mechanism:
    return LocalDpSgd(start.settings.fraction_train, start.settings.seed)


def _distributed(start: Start) -> Mechanism:
    s = start.settings
    return DistributedDpSgd(distributed.setup(s, start.plan, start.nodes, start.releases),
                            run_model(start.plan.model, s.seed, s.task), s.fraction_train, s.seed, start.resumed)


def _user(start: Start) -> Mechanism:
    return UserLevel(start.settings, start.nodes, seed=start.settings.seed, resumed=start.resumed)


def _user_distributed(start: Start) -> Mechanism:
    s = start.settings
    dimension = sum(t.numel() for t in run_model(start.plan.model, s.seed, s.task).state_dict().values())
    return DistributedUserLevel(s, start.nodes, dimension=dimension, seed=s.seed, resumed=start.resumed)


MODES: dict[tuple[PrivacyMode, UserNoise | None], Mode] = {
    (PrivacyMode.LOCAL, None): Mode(lambda s: s, _local),
    (PrivacyMode.DISTRIBUTED, None): Mode(lambda s: dataclasses.replace(s, target_epsilon=None), _distributed),
    (PrivacyMode.USER, UserNoise.CENTRAL): Mode(training_settings, _user),
    (PrivacyMode.USER, UserNoise.DISTRIBUTED): Mode(training_settings, _user_distributed),
}


def mode(settings: RunSettings) -> Mode:
    """The run's mode (``user-noise`` names one only with ``privacy = "user"``)."""
    return MODES[settings.privacy, settings.user_noise if settings.privacy is PrivacyMode.USER else None]
