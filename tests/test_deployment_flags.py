"""The deployment's flags that are run-config keys come from the settings' definitions, and
the run config it sends is one the ServerApp's parser accepts, with the deployment's own
defaults where it has them."""

from pathlib import Path

import pytest

from fedpriv.federation.settings import KEYS, RunSettings
from simulations.deployment import build_parser, run_config


def test_the_run_config_of_default_flags_parses_with_the_deployments_defaults(tmp_path):
    args = build_parser().parse_args(["--nodes", "2", "--rounds", "1", "--out", str(tmp_path)])
    config = run_config(args, Path(tmp_path))
    settings = RunSettings.from_run_config(config)
    assert (settings.delta, settings.seed, settings.limit_test, settings.round_timeout) == (
        KEYS["delta"].default, KEYS["seed"].default, 1000, 600.0)
    assert settings.resume is False and settings.secagg_neighbours == 0


@pytest.mark.parametrize("flag, value", [("--delta", "1"), ("--secagg-neighbours", "3"), ("--limit-test", "0"),
                                         ("--round-timeout", "-1")])
def test_a_value_outside_its_keys_bound_is_one_line_exit_2(flag, value, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--nodes", "2", "--rounds", "1", "--out", str(tmp_path), flag, value])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and flag in error and KEYS[flag[2:]].bound.text in error
