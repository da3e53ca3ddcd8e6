"""Run a server function, as the classic ServerApp (``server/classic/server_app.py``), over K
simulated nodes of the classic ClientApp (``clients/classic/client_app.py``) in Flower's
simulation engine, each node with the given policy, seeded randomness and its own durable
ledger; return what each node's ledger booked; and refuse to report a result where no
node answered. Shared by ``simulations.classic``, ``simulations.dpdropout`` and
``simulations.dppca``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.serverapp import Grid

if TYPE_CHECKING:
    from server.classic.loops import Shares


def run_on_nodes(prog: str, server: Callable[[Grid], None], clients: int, policy: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """Run ``server(grid)`` once all ``clients`` nodes are connected; partition id → that
    node's ``PrivacyLedger`` as it stands after the run (None: it booked nothing).
    ``policy`` holds the node policy's keys but ``state-dir`` (a temporary folder per node)."""
    from flwr.simulation import run_simulation

    from clients.classic.client_app import app as client_app
    from fedpriv.federation.policy import POLICY_ENV, policy_file_text
    from fedpriv.federation.seeded import warn_seeded
    from fedpriv.node import init_nodes
    from fedpriv.privacy import PrivacyLedger
    from server.classic.server_app import classic_server_app
    from simulations._ray import ray_cluster

    if policy.get("randomness") == "seeded":
        warn_seeded()  # this process's one warning; each node process prints its own
    finished: list[bool] = []
    server_app = classic_server_app(server, clients, finished)

    with tempfile.TemporaryDirectory(prefix="fedpriv-nodes-") as state:
        policy_path = Path(state) / "policy.toml"
        policy_path.write_text(policy_file_text({**policy, "state-dir": f"{state}/nodes/{{partition-id}}"}))
        init_nodes(policy_path, range(clients))
        with ray_cluster({}, {POLICY_ENV: str(policy_path)}):
            os.environ[POLICY_ENV] = str(policy_path)
            run_simulation(server_app=server_app, client_app=client_app, num_supernodes=clients,
                           backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
        if not finished:
            raise SystemExit(f"{prog}: the ServerApp did not finish; see the log above")
        ledgers = {}
        for client in map(str, range(clients)):
            path = Path(state) / "nodes" / client / "ledger.json"
            ledgers[client] = PrivacyLedger.load(path) if path.exists() else None
    return ledgers


def check_answered(prog: str, shares: Shares, clients: int) -> None:
    """``SystemExit`` (one line, exit 1) where no node's reply was accepted (each failed, e.g.
    its Ray worker died, or refused): the model would be the server's initial one, its metric
    no result. ``shares``: what the server loop gathered."""
    if shares.events:
        return
    reasons = sorted({(str(reason).splitlines() or [""])[0][:200] for reason in shares.refused.values()})
    raise SystemExit(f"{prog}: all {clients} nodes failed, so no metric (it would be the initial model's): "
                     + ("; ".join(reasons) or "no node replied"))
