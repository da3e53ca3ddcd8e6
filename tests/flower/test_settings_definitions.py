"""One settings model (issue 34): each run-config key is defined once (a field of
``fedpriv.federation.settings``), and pyproject.toml's run config, the docs' tables, the
simulations' flags and the mode table are what those definitions say; a run config is parsed
once into a frozen, keyword-only value of its mode, ``None`` for every unset value."""

import dataclasses
import tomllib

import pytest

from fedpriv.federation import modes, settings_docs
from fedpriv.federation.keys import SettingsError
from fedpriv.federation.settings import (
    KEYS,
    MODE_SETTINGS,
    USED_BY,
    CentralUserSettings,
    DistributedSettings,
    DistributedUserSettings,
    LocalSettings,
    RunSettings,
    parse_settings,
    used_by,
)
from fedpriv.project import PROJECT_ROOT
from simulations._cli import FLAG_KEYS, federated_parser

MODE_CONFIGS = {
    modes.LOCAL: {},
    modes.DISTRIBUTED: {"privacy": "distributed"},
    modes.USER_CENTRAL: {"privacy": "user", "noise-multiplier": 1.0},
    modes.USER_DISTRIBUTED: {"privacy": "user", "user-noise": "distributed", "noise-multiplier": 1.0},
}


def test_pyproject_and_the_docs_are_written_from_the_definitions():
    """``python -m fedpriv.federation.settings_docs --check`` (a stale file: rerun it without ``--check``)."""
    stale = [str(path) for path, text in settings_docs.generated().items() if path.read_text() != text]
    assert not stale, f"regenerate with python -m fedpriv.federation.settings_docs: {stale}"
    assert settings_docs.main(["--check"]) == 0


def test_pyprojects_run_config_is_every_key_at_its_default():
    config = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert config == {name: key.toml_default for name, key in KEYS.items()}
    value = parse_settings(config)
    assert isinstance(value, LocalSettings)
    unset = [f.name for f in dataclasses.fields(value) if KEYS[f.name.replace("_", "-")].optional]
    assert unset and all(getattr(value, name) is None for name in unset)  # no sentinel survives the edge


def test_a_stale_pyproject_is_found():
    text = (PROJECT_ROOT / "pyproject.toml").read_text().replace("rounds = 3", "rounds = 4")
    assert settings_docs.with_section(text) == (PROJECT_ROOT / "pyproject.toml").read_text()
    assert "rounds = 4" not in settings_docs.with_section(text)


def test_the_enums_choices_are_their_values():
    from fedpriv.distributed.lattice import Rounding
    from fedpriv.training import LRSchedule

    assert sorted(KEYS["lattice-rounding"].choices or ()) == sorted(Rounding)
    assert sorted(KEYS["lr-schedule"].choices or ()) == sorted(LRSchedule)
    assert isinstance(RunSettings().lattice_rounding, Rounding)
    assert RunSettings.from_run_config({"lr-schedule": "cosine"}).lr_schedule is LRSchedule.COSINE


@pytest.mark.parametrize("mode", modes.MODES)
def test_each_mode_parses_into_its_own_frozen_keyword_only_value(mode):
    value = parse_settings(MODE_CONFIGS[mode])
    assert type(value) is MODE_SETTINGS[mode] and value.mode == mode
    names = {f.name.replace("_", "-") for f in dataclasses.fields(value)}
    assert names == {name for name in KEYS if mode in used_by(name)} - {"privacy", "user-noise"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.rounds = 5
    with pytest.raises(TypeError):
        type(value)("mnist")
    union = RunSettings.of(value)
    assert union.mode_settings() == value and union.mode == mode
    assert RunSettings.from_run_config(MODE_CONFIGS[mode]) == union


def test_the_mode_values_are_the_four_modes():
    assert {cls.mode for cls in (LocalSettings, DistributedSettings, CentralUserSettings,
                                 DistributedUserSettings)} == set(modes.MODES)


@pytest.mark.parametrize(("config", "match"), [
    ({"cohort": ""}, r"cohort: bad value '' \(expected an integer\)"),
    ({"noise-multiplier": -2.0}, r"noise-multiplier must be >= 0 \(-1.0: the data set's plan\), got -2.0"),
    ({"delta": float("inf")}, "delta must be in"),
    ({"download": 1}, "download: bad value 1"),
    ({"secagg-neighbours": 3, "privacy": "distributed"}, "secagg-neighbours must be even and >= 0, got 3"),
    ({"model": "resnet"}, "model must be one of mlp, cnn"),
    ({"privacy": "central"}, "privacy must be one of local, distributed, user, got 'central'"),
    ({"privacy": "user", "noise-multiplier": 1.0, "user-noise": "server"},
     "user-noise must be one of central, distributed, got 'server'"),
    ({"user-noise": "distributed"}, "user-noise = 'distributed': privacy = 'local' does not use it"),
])
def test_a_bad_value_is_one_line_naming_its_key(config, match):
    with pytest.raises(SettingsError, match=match):
        parse_settings(config)


def test_a_key_the_mode_does_not_use_passes_at_its_default_and_in_either_spelling():
    assert parse_settings({"cohort": 0, "max-grad-norm": 1.0, "clip-lr": 0.2}).mode == modes.LOCAL
    assert parse_settings({"privacy": "user", "noise-multiplier": 1, "max-grad-norm": 0, "local-epochs": 3}) \
        .local_epochs == 3


def test_every_flag_is_a_key_as_defined():
    parser = federated_parser("mnist")
    actions = {a.dest: a for a in parser._actions}
    for key in FLAG_KEYS:
        action = actions[key.attr]
        assert action.option_strings[0] == f"--{key.name}" and action.default is None or key.name == "out"
        assert key.help in " ".join(action.help.split())
        if key.bound is not None:
            assert action.type is not None
    assert {k.name for k in FLAG_KEYS} == set(KEYS) - {"dataset", "task", "min-clients", "server-randomness"}
    assert set(USED_BY) - {"server-randomness"} <= {k.name for k in FLAG_KEYS}  # the simulations set it


def test_a_flag_refuses_what_its_key_refuses(capsys):
    parser = federated_parser("mnist")
    for flag, value, text in (("--clip-quantile", "1", "must be in (0, 1), got 1"),
                              ("--secagg-neighbours", "3", "must be even and >= 0, got 3"),
                              ("--round-timeout", "inf", "must be finite")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        assert f"argument {flag}: {text}" in capsys.readouterr().err
        with pytest.raises(SettingsError):
            parse_settings({flag.removeprefix("--"): float(value), "privacy": "user", "user-noise": "distributed",
                            "noise-multiplier": 1.0})
