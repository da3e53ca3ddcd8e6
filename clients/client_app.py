"""fedpriv's Flower ClientApp: local DP-SGD under the node's own policy and durable ledger.

Thin by design: each handler delegates to a release kind (``clients.release``): ``clients.task``
(local DP-SGD), ``clients.evaluation``, ``clients.distributed``, ``clients.userlevel`` and
``clients.userlevel_distributed``. A message the node will not answer (no policy, over
budget, already answered, malformed) gets an ``Error`` reply with ``REFUSAL_CODE`` and the
reason, and nothing is computed or released. Any other failure (after booking, or
unexpected) gets ``FAILURE_CODE`` and a fixed reason; its details stay in the node's log.
"""

import logging
from collections.abc import Callable

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from clients import distributed, evaluation, task, userlevel, userlevel_distributed
from clients.failures import ReleaseFailed
from clients.releases import Refusal
from clients.secure_sum import is_secure_sum
from fedpriv.federation import protocol
from fedpriv.federation.settings import PrivacyMode, RunSettings

# dp-accounting logs every RDP order it skips; harmless, and it floods the run log. absl
# also gives the root logger a handler, which would print Flower's lines twice.
logging.getLogger("absl").setLevel(logging.ERROR)
logging.getLogger("flwr").propagate = False

app = ClientApp()
log = logging.getLogger(__name__)


def answer(handler: Callable[..., RecordDict], msg: Message, context: Context) -> Message:
    """``handler``'s reply, or a refusal saying why: ``ValueError`` covers bad input of every
    kind here (policy, settings, protocol, ledger), ``KeyError``/``TypeError`` a message
    missing a record or holding one of the wrong type (untrusted input, never a crash).
    Handlers raise these only before booking (after it, ``clients.failures.after_booking``
    turns every error into ``ReleaseFailed``). Any other exception leaves only as a fixed
    text: its own could carry the node's data, and Flower would send it."""
    try:
        return Message(handler(msg, context), reply_to=msg)
    except ReleaseFailed:
        return Message(Error(code=protocol.FAILURE_CODE, reason=protocol.FAILED_AFTER_BOOKING), reply_to=msg)
    except (Refusal, ValueError, KeyError, TypeError) as err:
        return Message(Error(code=protocol.REFUSAL_CODE, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
    except Exception:
        log.exception("the node failed to answer a %s message", msg.metadata.message_type)
        return Message(Error(code=protocol.FAILURE_CODE, reason=protocol.FAILED), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this client's id, its released N and what an evaluation costs."""
    return answer(lambda _, ctx: task.describe(ctx), msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Book the round in the node's ledger, then train locally with DP-SGD; or refuse."""
    return answer(_train, msg, context)


def _train(msg: Message, context: Context) -> RecordDict:
    """The TRAIN handler of the message: a secure-aggregation stage of a distributed round
    (``clients.distributed``; of a distributed user-level round, ``clients.userlevel_distributed``),
    a central user-level round (``clients.userlevel``) or local DP-SGD."""
    user = RunSettings.from_run_config(context.run_config).privacy is PrivacyMode.USER
    if is_secure_sum(msg):
        return distributed.train(msg, context, userlevel_distributed.contribute if user else None)
    if user:
        return userlevel.train(msg, context)
    return task.train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """A noisy, booked evaluation where the node's policy allows it; else a refusal."""
    return answer(evaluation.evaluate, msg, context)
