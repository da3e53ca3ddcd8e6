"""The task contract's checks (``fedpriv.task``): each broken task is one line naming the
app, the function and what was expected; ``python -m simulations.run`` turns it into
``prog: error: ...``, exit 2, before any ledger exists or any process starts."""

import pytest
import torch

from fedpriv.task import TaskError, as_tensors, check_task, load_task
from simulations import run as run_command
from tests.task.conftest import GOOD

BROKEN = {
    "does not import": ("def model(:\n", "task module 'task' does not import"),
    "no model": (GOOD.replace("def model():", "def other():"), "task.model is missing"),
    "no load_data": (GOOD.replace("def load_data(", "def other("), "task.load_data is missing"),
    "one data set": (GOOD.replace("return torch.utils.data.TensorDataset(x, y), ", "return "),
                     "task.load_data must return (train, test)"),
    "x not a tensor": (GOOD.replace("return torch.utils.data.TensorDataset(x, y),",
                                    "return [(row.tolist(), int(label)) for row, label in zip(x, y)],"),
                       "load_data's train set: item 0's x must be a tensor"),
    "ragged items": (GOOD.replace("return torch.utils.data.TensorDataset(x, y),",
                                  "return [(x[0], 1), (x[1, :2], 0)],"),
                     "item 1 is x (2,) float32"),
    "empty share": (GOOD.replace("TensorDataset(x, y),", "TensorDataset(x[:0], y[:0]),"),
                    "load_data's train set must hold at least one"),
    "output misfits loss": (GOOD.replace("nn.Linear(4, 2)", "nn.Linear(4, 2), nn.Unflatten(1, (1, 2))"),
                            "task.loss does not fit the model: outputs (1, 1, 2) float32 against targets (1,) int64"),
    "batchnorm": (GOOD.replace("nn.Tanh()", "nn.BatchNorm1d(4)"), "task.model(): DP-SGD needs per-example"),
    "model not a module": (GOOD + "\ndef model():\n    return 'a model'\n",
                           "task.model() must return a torch.nn.Module"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_task_is_one_line_naming_app_and_function(write_app, case, tmp_path):
    source, expected = BROKEN[case]
    app = write_app(source, name="myapp")
    with pytest.raises(TaskError) as caught:
        check_task(load_task("task", app), app / "data", num_partitions=2)
    message = str(caught.value)
    assert message.startswith("app myapp: ") and expected in message and "\n" not in message


@pytest.mark.parametrize("case", ["no model", "output misfits loss", "batchnorm"])
def test_simulations_run_refuses_before_any_ledger_or_process(write_app, case, tmp_path, capsys):
    app = write_app(BROKEN[case][0], name="myapp")
    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    with pytest.raises(SystemExit) as exit_:
        run_command.main(["--app", str(app), "--clients", "2", "--rounds", "1", "--state-dir", str(state),
                          "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith("python -m simulations.run: error: app myapp: ")
    assert BROKEN[case][1] in err
    assert not any(state.iterdir()) and not out.exists()  # nothing booked, initialised or written


def test_simulations_run_refuses_an_out_holding_results_before_the_task(write_app, tmp_path, capsys):
    """The cheap checks of simulations.mnist hold for an app too: an ``--out`` holding an
    earlier run's results is one line, exit 2, before the (here broken) task is imported."""
    app = write_app(BROKEN["no model"][0], name="myapp")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        run_command.main(["--app", str(app), "--clients", "2", "--rounds", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "argument --out: " in err and "app myapp" not in err


@pytest.mark.parametrize(("config", "argv", "expected"), [
    ({"privacy": "distributed"}, ["--local-epochs", "2"],
     "argument --local-epochs: --privacy distributed does not use it (only --privacy local or --privacy user)"),
    ({"privacy": "user"}, ["--max-grad-norm", "2"], "argument --max-grad-norm: --privacy user (central noise)"),
    ({}, ["--limit-train", "100"], "argument --limit-train: a user's task chooses its own data"),
    ({}, ["--limit-test", "100"], "argument --limit-test: a user's task chooses its own data"),
])
def test_simulations_run_checks_flags_against_the_apps_own_run_config(write_app, config, argv, expected, tmp_path,
                                                                     capsys):
    """A flag is checked against the mode the app's pyproject.toml sets (not fedpriv's default
    local mode); ``--limit-train``/``--limit-test`` are refused for a task (its ``load_data``
    chooses its data): each one line, exit 2, nothing written."""
    app, out = write_app(config=config, name="myapp"), tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        run_command.main(["--app", str(app), "--clients", "2", "--rounds", "1", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m simulations.run: error: {expected}"), err
    assert not out.exists()


def test_an_app_without_a_task_is_refused(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app.config]\nrounds = 1\n")
    with pytest.raises(SystemExit) as exit_:
        run_command.main(["--app", str(tmp_path), "--clients", "2"])
    assert exit_.value.code == 2 and "sets no task" in capsys.readouterr().err


class Items(torch.utils.data.Dataset):
    """A map-style data set of NumPy images and integer labels (no TensorDataset)."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return torch.full((2, 3), float(i)).numpy(), i % 2


def test_any_map_style_data_set_becomes_tensors_and_a_tensor_pair_stays_as_it_is():
    pair = as_tensors(Items(), "items")
    assert pair.features.shape == (5, 2, 3) and pair.labels.tolist() == [0, 1, 0, 1, 0]
    assert pair.labels.dtype == torch.int64 and torch.equal(pair.features[3], torch.full((2, 3), 3.0))
    x, y = torch.randn(4, 3), torch.arange(4)
    fast = as_tensors(torch.utils.data.TensorDataset(x, y), "pair")
    assert fast.features is x and fast.labels is y  # the fast path: no copy


def test_the_model_is_seeded_and_leaves_the_callers_random_state(write_app):
    task = load_task("task", write_app())
    state = torch.get_rng_state()
    first, second = task.build_model(3), task.build_model(3)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert not torch.equal(task.build_model(4)[0].weight, first[0].weight)


@pytest.mark.parametrize("name", ["json", "pytest", "sys"])
def test_a_run_config_cannot_make_a_node_import_an_installed_module(name):
    with pytest.raises(TaskError, match="does not import: ImportError: .* not a module of the app"):
        load_task(name)


@pytest.mark.parametrize("key", ["limit-train", "limit-test"])
def test_a_run_config_limiting_a_tasks_data_is_refused_by_every_party(key):
    """The apps (server and nodes, also under flwr run) parse the run config with RunSettings:
    a limit on a task's data, which its load_data chooses, is refused, not ignored."""
    from fedpriv.federation.settings import RunSettings, SettingsError

    RunSettings.from_run_config({key: 100})  # the built-in data sets: the first 100 records
    with pytest.raises(SettingsError, match=f"^{key}: a user's task chooses its own data"):
        RunSettings.from_run_config({"task": "task", key: 100})
    assert RunSettings.from_run_config({"task": "task", key: 0}).task == "task"  # 0: unset (pyproject's default)


def test_the_servers_accuracy_of_a_task_without_metrics_counts_argmax_hits_of_classes_only():
    """A classifier's accuracy is its argmax hits; a regression's float (B, 1) targets have no
    argmax to match, so none is correct (broadcast against the (B,) argmax they used to count
    a B × B table of chance matches)."""
    import types

    import torch.nn.functional as F

    from fedpriv.data import TensorPair
    from fedpriv.task import Task, evaluate_task

    classifier = Task("app", "task", types.ModuleType("task"))
    logits = torch.nn.Linear(2, 2)
    x = torch.randn(40, 2)
    y = logits(x).argmax(dim=1).detach()
    y[:10] = 1 - y[:10]  # 30 of 40 right
    assert evaluate_task(classifier, logits, TensorPair(x, y))[1] == pytest.approx(0.75)

    module = types.ModuleType("task")
    module.loss = F.mse_loss
    regression = Task("app", "task", module)
    line = torch.nn.Linear(2, 1)
    targets = torch.zeros(40, 1)  # argmax of (40, 1) outputs is 0 everywhere: all "right" when broadcast
    loss, accuracy = evaluate_task(regression, line, TensorPair(x, targets))
    assert accuracy == 0.0 and loss == pytest.approx(float(F.mse_loss(line(x), targets)))
