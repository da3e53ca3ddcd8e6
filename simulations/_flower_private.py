"""Flower's private API, each use behind one function here.

fedpriv drives Flower's simulation engine the way Flower's own ``flwr-simulation`` process
does (``_run_simulation`` with a ``Run`` of ours, since the public ``run_simulation`` leaves
the run config empty), and sets the process's ``TaskIdentity`` that messages read their
run and task ids from. Neither is public API; ``tests/test_flower_private.py`` checks each
name and every parameter used here, so a Flower upgrade that moves one fails there, loudly,
not somewhere inside a simulation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

RUN_SIMULATION_PARAMETERS = (
    "num_supernodes", "exit_event", "server_app_attr", "client_app_attr", "backend_name", "backend_config",
    "server_app_context", "app_dir", "run", "is_app",
)
"""The parameters of ``flwr.simulation.run_simulation._run_simulation`` that fedpriv passes."""


def set_task_identity(run_id: int, task_id: int, node_id: int) -> None:
    """Make messages built in this process carry these ids (``flwr.supercore.task_identity``)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = run_id, task_id, node_id


@contextlib.contextmanager
def task_identity(run_id: int, task_id: int, node_id: int) -> Iterator[None]:
    """``set_task_identity`` for a block, the previous identity restored after it."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    set_task_identity(run_id, task_id, node_id)
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


def run_simulation(run: Any, **kwargs: Any) -> None:
    """Flower's in-process engine on ``run`` (a ``flwr.supercore.run.Run`` carrying our run
    config), with the keyword arguments of ``RUN_SIMULATION_PARAMETERS``."""
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    unknown = set(kwargs) - set(RUN_SIMULATION_PARAMETERS)
    if unknown:
        raise TypeError(f"not a parameter fedpriv passes to _run_simulation: {sorted(unknown)}")
    _run_simulation(exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE, run=run, is_app=True, **kwargs)
