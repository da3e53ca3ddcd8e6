"""Resuming the secure-sum modes (distributed, and user level with distributed noise): a run
killed as its second round starts and resumed ends with the uninterrupted run's ledgers
and model. The uninterrupted run is the pinned one (``tests.flower.test_mode_pins``: the
same settings, seed and nodes), so each mode costs one killed and one resumed run.
(Local and central user level: ``tests/flower/test_resume.py``, ``tests/userlevel/test_resume.py``.)"""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from server.run import run_server
from tests.flower.inprocess import InProcessGrid, ServerKilled, consortium, node_config
from tests.flower.test_mode_pins import COMMON, MODES, NODES, PINS, POLICY, _ledger, _same_platform

pytestmark = pytest.mark.usefixtures("task_identity")


class KilledInRound2(InProcessGrid):
    """Killed when the first message of round 2 (its secure sum's first stage) is sent."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any("/round-2/" in m.metadata.group_id for m in messages):
            raise ServerKilled("killed as round 2 starts")
        return super().send_and_receive(messages, timeout=timeout)


def _grid(grid_class: type[InProcessGrid], root: Path, data_dir: Path, resume: bool) -> tuple[Any, dict]:
    config = {**COMMON, **MODES[root.name], "data-dir": str(data_dir), "state-dir": str(root / "server"),
              "out": str(root / "out"), "resume": resume}
    members = consortium(root / "consortium", NODES)
    nodes = {10 + i: node_config(i, NODES, root, **POLICY, **members[i], **{"data-dir": str(data_dir),
                                                                         "seed": 11 + i})
             for i in range(NODES)}
    return grid_class(config, nodes), config


@pytest.mark.parametrize("mode", ["distributed", "user-distributed"])
def test_a_killed_secure_sum_run_resumes_and_ends_as_the_pinned_uninterrupted_one(mode, tmp_path, shared_data_dir):
    pins = json.loads(PINS.read_text())
    root = tmp_path / mode
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pins were taken
    try:
        grid, config = _grid(KilledInRound2, root, shared_data_dir, resume=False)
        with pytest.raises(ServerKilled):
            run_server(grid, config)
        grid, config = _grid(InProcessGrid, root, shared_data_dir, resume=True)
        history = run_server(grid, config)
    finally:
        torch.set_num_threads(threads)
    expected = pins["modes"][mode]
    assert [r.round for r in history.rounds] == [1, 2]
    assert _ledger(root / "server" / "ledger.json", history.run_key) == expected["server_ledger"]
    assert {str(i): _ledger(root / f"node{i}" / "ledger.json", history.run_key)
            for i in range(NODES)} == expected["node_ledgers"]
    if _same_platform(pins):
        assert history.model_sha256 == expected["results"]["model_sha256"]
