"""fedpriv's Flower ServerApp: budget-aware FedAvg over clients running local DP-SGD.

Thin by design: ``server.run.run_server`` does the work.
"""

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.run import run_server

# dp-accounting logs every RDP order it skips; harmless, and it floods the run log.
logging.getLogger("absl").setLevel(logging.ERROR)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation described by ``context.run_config``."""
    run_server(grid, context.run_config)
