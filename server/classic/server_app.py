"""The classic algorithms' ServerApp: once ``clients`` nodes are connected, run one of the
loops of ``server.classic.loops`` over the Grid. ``simulations._classic_nodes`` runs it in
Flower's simulation engine beside the classic ClientApp (``clients.classic.client_app``)."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.discovery import wait_for_nodes


def classic_server_app(server: Callable[[Grid], None], clients: int, finished: list[bool]) -> ServerApp:
    """A ServerApp that waits for ``clients`` nodes (the engine registers them while it
    already runs), runs ``server(grid)`` and appends True to ``finished`` once it returned."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        wait_for_nodes(grid, clients)
        server(grid)
        finished.append(True)

    return app
