"""A flag (or run-config key) the chosen privacy mode does not use is an error (one line,
exit 2, naming the flag and the mode), from one table (``fedpriv.federation.settings.USED_BY``,
the groups of the settings' fields); and what the table says a mode ignores, the run indeed
ignores."""

import pytest

from fedpriv.federation import modes
from fedpriv.federation.settings import KEYS, USED_BY, RunSettings, SettingsError
from fedpriv.project import run_config_defaults
from simulations._cli import federated_parser
from simulations._command import check_mode_flags
from simulations.mnist import main as mnist

VALUES = {"max-grad-norm": "1.0", "local-epochs": "2", "fraction-train": "0.5", "lattice-rounding": "conditional",
          "secagg-neighbours": "2", "cohort": "2", "user-clip": "0.5", "user-noise": "central",
          "clip-quantile": "0.5", "clip-lr": "0.2", "clip-count-noise": "2", "clip-warmup-rounds": "1",
          "clip-warmup-lr": "1"}
MODE_FLAGS = {modes.LOCAL: ["--privacy", "local"], modes.DISTRIBUTED: ["--privacy", "distributed"],
              modes.USER_CENTRAL: ["--privacy", "user"],
              modes.USER_DISTRIBUTED: ["--privacy", "user", "--user-noise", "distributed"]}


def _flags(key: str, mode: str) -> list[str]:
    user_noise = ["--user-noise", "distributed"] if key == "user-noise" and mode == modes.USER_DISTRIBUTED else []
    return MODE_FLAGS[mode] + ([f"--{key}", VALUES[key]] if not user_noise else []) + user_noise


@pytest.mark.parametrize(("argv", "flag", "mode"), [
    (["--cohort", "5"], "--cohort", "--privacy local"),
    (["--privacy", "distributed", "--local-epochs", "2"], "--local-epochs", "--privacy distributed"),
    (["--privacy", "user", "--fraction-train", "0.5"], "--fraction-train", "--privacy user"),
    (["--privacy", "user", "--max-grad-norm", "1"], "--max-grad-norm", "--privacy user"),
])
def test_the_issues_commands_exit_2_with_one_line_naming_the_flag_and_the_mode(argv, flag, mode, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        mnist([*argv, "--noise-multiplier", "1", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"python -m simulations.mnist: error: argument {flag}: {mode}"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", sorted(key for key in USED_BY if KEYS[key].flag))
def test_each_mode_accepts_exactly_the_flags_the_table_gives_it(key, capsys):
    parser = federated_parser("mnist")
    for mode in modes.MODES:
        args = parser.parse_args(_flags(key, mode))
        if mode in USED_BY[key]:
            check_mode_flags(parser, args)
        else:
            with pytest.raises(SystemExit):
                check_mode_flags(parser, args)
            assert f"argument --{key}: {modes.DESCRIPTIONS[mode]} does not use it" in capsys.readouterr().err


def test_unset_flags_and_the_default_mode_pass():
    parser = federated_parser("mnist")
    check_mode_flags(parser, parser.parse_args([]))
    assert modes.mode_of(run_config_defaults()["privacy"], run_config_defaults()["user-noise"]) == modes.LOCAL


def test_the_table_names_real_run_config_keys_and_modes():
    defaults = run_config_defaults()
    flags = {a.dest for a in federated_parser("mnist")._actions}
    for key, used in USED_BY.items():
        assert key in defaults and (key.replace("-", "_") in flags or not KEYS[key].flag)
        assert used <= set(modes.MODES) and used
    with pytest.raises(ValueError):
        modes.mode_of("central", "central")


@pytest.mark.parametrize(("mode", "key", "values"), [
    (modes.DISTRIBUTED, "local-epochs", (1, 2)),
    (modes.USER_CENTRAL, "max-grad-norm", (0.0, 0.01)),
    (modes.USER_CENTRAL, "fraction-train", (1.0, 0.5)),
])
def test_what_the_table_calls_unused_leaves_the_run_unchanged(mode, key, values, tmp_path, shared_data_dir,
                                                             task_identity, one_torch_thread, monkeypatch):
    """The same seeded run with either value of ``key``: the same model and ledgers (what the
    table refuses would otherwise be silently ignored). The apps parse each value into the
    union as it is (the mode's refusal of the key is bypassed), so a run that read the key
    would differ."""
    from server.run import run_server
    from tests.flower.inprocess import InProcessGrid, booked, node_config

    def union(cls, config):
        return cls(**{KEYS[name].attr: KEYS[name].parse(value) for name, value in config.items()})

    monkeypatch.setattr(RunSettings, "from_run_config", classmethod(union))

    privacy = {modes.DISTRIBUTED: {"privacy": "distributed"},
               modes.USER_CENTRAL: {"privacy": "user", "server-randomness": "seeded", "user-clip": 0.05}}[mode]
    outcomes = []
    for value in values:
        root = tmp_path / str(value)
        config = {"rounds": 1, "min-clients": 3, "limit-train": 40, "limit-test": 20, "model": "mlp", "seed": 3,
                  "lot-size": 10, "lr": 0.1, "noise-multiplier": 1.0, "data-dir": str(shared_data_dir),
                  "state-dir": str(root / "server"), **privacy, key: value}
        nodes = {10 + i: node_config(i, 3, root, **{
            "epsilon-budget": 100.0, "public-num-examples": True, "data-dir": str(shared_data_dir),
            "randomness": "seeded", "seed": 5 + i, "allow-distributed": True, "allow-central-user": True,
            "min-cohort": 2, "uncertified-cohort": "own-share"}) for i in range(3)}
        history = run_server(InProcessGrid(config, nodes), config)
        assert not any(r.discarded for r in history.rounds), history.rounds  # the mode ran, not refused
        entries = {i: [(e.split("/", 1)[1], ev) for e, ev in booked(root / f"node{i}")[str(i)].items()]
                   for i in range(3)}
        outcomes.append((history.model_sha256, entries, history.final_epsilon()))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(("config", "line"), [
    ({"cohort": 5}, "cohort = 5: privacy = 'local' does not use it (only privacy = 'user')"),
    ({"privacy": "distributed", "local-epochs": 2},
     "local-epochs = 2: privacy = 'distributed' does not use it (only privacy = 'local' or privacy = 'user')"),
    ({"privacy": "user", "noise-multiplier": 1.0, "max-grad-norm": 1.0},
     "max-grad-norm = 1.0: privacy = 'user' (central noise) does not use it "
     "(only privacy = 'local' or privacy = 'distributed')"),
    ({"privacy": "user", "noise-multiplier": 1.0, "accept-failures": True, "lattice-rounding": "conditional"},
     "lattice-rounding = 'conditional': privacy = 'user' (central noise) does not use it "
     "(only privacy = 'distributed' or privacy = 'user', user-noise = 'distributed')"),
])
def test_the_server_app_refuses_at_its_start_a_key_the_mode_does_not_use(config, line):
    """``flwr run``'s run config: a key the mode does not use, at another value than its
    default, stops the ServerApp before it discovers a node (its grid is never touched), with
    one line naming the key and the mode; at its default (pyproject's every key) it passes."""
    from server.run import run_server

    with pytest.raises(SettingsError) as error:
        run_server(None, {**run_config_defaults(), **config})
    assert str(error.value) == line
    defaults = {**run_config_defaults(), "privacy": "user", "noise-multiplier": 1.0}
    assert RunSettings.from_run_config(defaults).mode == modes.USER_CENTRAL


def test_the_client_app_refuses_it_too(task_identity):
    """A node parses the run config as the server does: it refuses the round, saying why."""
    from flwr.app import Context, Message, RecordDict

    from clients.client_app import train

    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1}, state=RecordDict(),
                      run_config={**run_config_defaults(), "cohort": 5})
    reply = train(Message(RecordDict(), dst_node_id=1, message_type="train"), context)
    assert reply.has_error()
    assert reply.error.reason == "SettingsError: cohort = 5: privacy = 'local' does not use it (only privacy = 'user')"


def test_an_apps_defaults_for_another_mode_are_reset_with_a_note_not_refused(tmp_path, capsys):
    """A user's app (python -m fedpriv new) holds its template's defaults for local DP-SGD
    (local-epochs = 5): run in distributed mode by the flag, they are not the user's choice
    there, so the simulation resets them (a note names each) and the run config passes."""
    from fedpriv.federation.settings import parse_settings
    from fedpriv.new import pyproject
    from simulations._run_config import fused_run_config

    (tmp_path / "pyproject.toml").write_text(pyproject("app", {"task": "task", "local-epochs": 5, "lot-size": 64}))
    parser = federated_parser("app")
    _, run_config = fused_run_config(parser, parser.parse_args(["--privacy", "distributed"]), None, tmp_path)
    assert (run_config["local-epochs"], run_config["lot-size"], run_config["privacy"]) == (1, 64, "distributed")
    (note,) = capsys.readouterr().err.splitlines()
    assert "note: the app's local-epochs = 5 is not used by this run's privacy mode" in note
    assert parse_settings(run_config).mode == modes.DISTRIBUTED
    _, local = fused_run_config(parser, parser.parse_args([]), None, tmp_path)
    assert local["local-epochs"] == 5 and not capsys.readouterr().err  # its own mode keeps them


def test_a_user_apps_privacy_mode_is_the_mode_its_flags_are_checked_against(capsys):
    """``simulations.run --app``: without ``--privacy``, the mode is the app's run config's."""
    parser = federated_parser("app")
    args = parser.parse_args(["--cohort", "2"])
    check_mode_flags(parser, args, {"privacy": "user"})
    with pytest.raises(SystemExit):
        check_mode_flags(parser, args, {"privacy": "local"})
    assert "argument --cohort: --privacy local does not use it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check_mode_flags(parser, parser.parse_args(["--cohort", "2", "--privacy", "local"]), {"privacy": "user"})
