"""The console of the simulation commands: each log line once, no harmless Ray tip.

- Flower logs through its own console handler on the ``flwr`` logger. ``absl.logging``
  (used by dp-accounting, e.g. its "_compute_log_a_frac failed to converge" warning) calls
  ``logging.basicConfig()`` the first time it logs, which gives the root logger a handler:
  from then on every Flower record would also propagate there and print a second time
  (``INFO:flwr:...``, and Flower's DEBUG records too). So ``flwr`` does not propagate.
- ``ray.init`` warns on every start (``FutureWarning``, "Tip: In future versions of Ray,
  Ray will no longer override accelerator visible devices env var if num_gpus=0 ..."). Ray
  (2.55 here) hides the GPUs from an actor that asked for none, which is what
  ``--gpus-per-client 0`` means; the tip only announces that a future version will not.
  Only that warning is filtered, by category and the start of its message. (Should the
  default change, ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` keeps today's behaviour.)
- Flower colours its level names with ANSI codes; when stderr is not a terminal (a log
  file, a pipe) they are left out.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings

RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices"


def quiet_console() -> None:
    """Stop Flower's records reaching the root logger, filter Ray's accelerator tip, and
    drop Flower's colours when stderr is not a terminal."""
    from flwr.supercore.logger import update_console_handler

    logging.getLogger("flwr").propagate = False
    warnings.filterwarnings("ignore", message=re.escape(RAY_ACCELERATOR_TIP), category=FutureWarning)
    if not sys.stderr.isatty():
        update_console_handler(colored=False)
