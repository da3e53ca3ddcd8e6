"""Fixtures of the task tests: user apps written on the fly, each imported apart."""

import pathlib
import sys
import textwrap

import pytest

from fedpriv import task as task_module

GOOD = '''
import torch
from torch import nn

def model():
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

def load_data(partition_id, num_partitions, data_dir):
    g = torch.Generator().manual_seed(partition_id)
    x = torch.randn(40, 3, generator=g)
    y = (x[:, 0] > 0).long()
    return torch.utils.data.TensorDataset(x, y), torch.utils.data.TensorDataset(x[:10], y[:10])
'''


@pytest.fixture
def write_app(tmp_path):
    """``write_app(source, name, config)``: an app folder holding ``task.py`` = ``source`` and a
    pyproject.toml naming it (fedpriv's run-config defaults, ``config`` over them); the
    module cache and ``sys.path`` are restored after the test."""
    from fedpriv.new import pyproject

    path, modules = list(sys.path), set(sys.modules)

    def write(source: str = GOOD, name: str = "app", config: dict | None = None) -> pathlib.Path:
        app = tmp_path / name
        (app / "data").mkdir(parents=True)
        (app / "task.py").write_text(textwrap.dedent(source))
        (app / "pyproject.toml").write_text(pyproject(name, {"task": "task", **(config or {})}))
        return app

    yield write
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name == "task" or name.startswith("_fedpriv_task_"):
            del sys.modules[name]
    task_module._load_task.cache_clear()


@pytest.fixture(scope="session")
def template_apps(tmp_path_factory) -> dict:
    """``python -m fedpriv new`` of each template, once for the session's tests that run them
    (they only read the apps: each run writes to its own --out)."""
    from fedpriv.__main__ import main as fedpriv_main
    from fedpriv.templates import TEMPLATES

    root = tmp_path_factory.mktemp("templates")
    apps = {template: fedpriv_main(["new", str(root / template), "--template", template]) for template in TEMPLATES}
    for app in apps.values():
        assert (app / "task.py").is_file() and 'task = "task"' in (app / "pyproject.toml").read_text()
    return apps
