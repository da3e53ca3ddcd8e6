"""fedpriv's Flower ClientApp: local DP-SGD with the client's own privacy ledger.

Thin by design: each handler delegates to ``clients.task``.
"""

import logging

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients import task

# dp-accounting logs every RDP order it skips; harmless, and it floods the run log.
logging.getLogger("absl").setLevel(logging.ERROR)

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this client's id and number of training examples."""
    return Message(task.describe(context), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train locally with DP-SGD, or refuse a round over the client's own budget."""
    return task.train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this client's share of the test set."""
    return task.evaluate_local(msg, context)
