"""The run config of a federated simulation: the flags over the app's
``[tool.flwr.app.config]``, fused as ``flwr run`` fuses them (``fused_run_config``), and
checked as the apps will parse it (``check_settings``); a value they would refuse is one
``parser.error`` line naming its flag."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedpriv.federation import modes
from fedpriv.federation.settings import KEYS, SELECTORS, RunSettings, SettingsError, used_by
from fedpriv.project import run_config_defaults
from simulations._cli import FLAG_KEYS, FLAGS, flag_message


def fused_run_config(parser: argparse.ArgumentParser, args: argparse.Namespace, dataset: str | None,
                     app_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the overrides, the run config the apps will see): the flags over the app's run
    config; the app's defaults for another mode than the run's reset, with a note each
    (``other_modes_defaults``)."""
    from flwr.common.config import get_fused_config_from_dir

    defaults = get_fused_config_from_dir(app_dir, {})
    overrides = run_config_overrides(args, dataset, defaults)
    for key, value in other_modes_defaults(defaults, overrides).items():
        print(f"{parser.prog}: note: the app's {key} = {value!r} is not used by this run's privacy mode: left at "
              "its default", file=sys.stderr)
        overrides[key] = KEYS[key].toml_default
    return overrides, get_fused_config_from_dir(app_dir, overrides)


def run_config_overrides(args: argparse.Namespace, dataset: str | None,
                         defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run-config keys the user set (kebab-case), the data set (none for a user's app:
    its task is in its own run config), ``min-clients``, and at user level (the flag's, else
    ``defaults``' privacy: the app's run config, pyproject's by default) the server's seeded
    randomness: a simulation is reproducible."""
    overrides: dict[str, Any] = {"min-clients": args.clients}
    if (args.privacy or (defaults or run_config_defaults())["privacy"]) == "user":
        overrides["server-randomness"] = "seeded"
    if dataset is not None:
        overrides["dataset"] = dataset
    for key in FLAG_KEYS:
        value = getattr(args, key.attr)
        if value is not None:
            overrides[key.name] = str(Path(value).resolve()) if key.path else value
    return overrides


def other_modes_defaults(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of an app's run config (``defaults``) that no flag set, the run's mode does
    not use, and that hold another value than their definition's default: an app's defaults
    for another mode (a template's ``local-epochs`` for local DP-SGD) are not the user's
    choice in this command, so they are reset (with a note) rather than refused."""
    mode = modes.mode_of(*(str(overrides.get(key, defaults.get(key, KEYS[key].default))) for key in SELECTORS))
    found = {}
    for key, value in defaults.items():
        if key in KEYS and key not in overrides and mode not in used_by(key):
            with contextlib.suppress(SettingsError):  # a bad value: check_settings names it
                if KEYS[key].parse(value) != KEYS[key].default:
                    found[key] = value
    return found


def check_settings(parser: argparse.ArgumentParser, run_config: Mapping[str, Any]) -> RunSettings:
    """The fused run config as the apps will parse it (``RunSettings``, then the training plan
    the server derives from it); a value they would refuse is ``parser.error`` naming its flag."""
    from server.assign import base_plan

    try:
        settings = RunSettings.from_run_config(run_config)
        base_plan(settings)
        if settings.resume:
            from server.state import ServerState

            if settings.state_dir is None:  # RunSettings refused it already
                raise SettingsError("resume needs state-dir: the folder of the run to continue")
            ServerState(settings.state_dir).load()  # StateError: nothing to resume there
    except ValueError as err:  # SettingsError, StateError, or the plan's own checks
        parser.error(flag_message(str(err), FLAGS))
    return settings
