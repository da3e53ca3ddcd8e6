"""``python -m fedpriv new APP_DIR --template tabular|image|text``: a Flower app of one's own
task (``fedpriv.task``), ready for ``flwr run APP_DIR`` and ``python -m simulations.run``.

It writes ``task.py`` (the template module, ``fedpriv.templates``, as it is), its data under
``data/`` (the template's ``prepare``), a ``pyproject.toml`` whose ``[tool.flwr.app]`` names
fedpriv's ServerApp and ClientApp with the run-config key ``task = "task"`` and every other
key at fedpriv's default (the template's ``RUN_CONFIG`` over them), and a short README.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedpriv.federation.settings_docs import config_section, toml_value
from fedpriv.templates import TEMPLATES

TASK_MODULE = "task"
DATA_FOLDER = "data"


def new_app(app_dir: Path, template: str) -> Path:
    """Write the app of ``template`` into ``app_dir`` (which must not exist or be empty)."""
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    if app_dir.exists() and (not app_dir.is_dir() or any(app_dir.iterdir())):
        raise ValueError(f"{app_dir} exists and is not an empty folder: choose a new APP_DIR")
    module = importlib.import_module(f"fedpriv.templates.{template}")
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / f"{TASK_MODULE}.py").write_text(inspect.getsource(module))
    module.prepare(app_dir / DATA_FOLDER)
    (app_dir / "pyproject.toml").write_text(pyproject(app_dir.name, {"task": TASK_MODULE, **module.RUN_CONFIG}))
    (app_dir / "README.md").write_text(readme(app_dir.name, template))
    return app_dir


def pyproject(name: str, config: Mapping[str, Any]) -> str:
    """The app's pyproject.toml: fedpriv's apps and run config, ``config`` over its defaults."""
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", f"name = {toml_value(_package_name(name))}", 'version = "1.0.0"',
        'description = "A fedpriv app: your model and data under differential privacy"',
        'dependencies = ["fedpriv"]', "",
        "[tool.hatch.build.targets.wheel]", 'packages = ["."]', "",
        "[tool.flwr.app]", 'publisher = "you"', "",
        "[tool.flwr.app.components]", 'serverapp = "server.server_app:app"', 'clientapp = "clients.client_app:app"', "",
    ]
    header = ("# fedpriv's run config (docs/federated.md, docs/own-task.md); task names your task module.",)
    return "\n".join(lines) + "\n" + config_section(config, header)


def _package_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return cleaned or "fedpriv-app"


def readme(name: str, template: str) -> str:
    return f"""# {name}

A [fedpriv](https://github.com/) app made by `python -m fedpriv new --template {template}`:
your model and data (`task.py`), trained by fedpriv's ClientApp and ServerApp with the
privacy mode of the run config (`pyproject.toml`, `[tool.flwr.app.config]`).

- `task.py`: `model()`, `load_data(partition_id, num_partitions, data_dir)` (and optionally
  `loss`, `metrics`). Replace them with your own; one record (the unit of each node's DP
  guarantee) is one item of the train set. See docs/own-task.md.
- `data/`: the template's data. A node reads the data folder of its own policy
  (`data-dir`), never one the server names.

Simulate (Ray), from fedpriv's folder:

    python -m simulations.run --app {name} --clients 2 --rounds 3 --target-epsilon 8 --out runs/{name}

Deploy: `flwr run {name} <federation>` against a SuperLink whose SuperNodes run
fedpriv with their own policy (docs/deployment.md).
"""
