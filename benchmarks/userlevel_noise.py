"""fedpriv's user-level DP-FedAvg with the noise added centrally and by the clients under
secure aggregation (``user-noise``), the same federation, z, S, rounds and seed
(``docs/user-level.md``): ``python -m benchmarks.userlevel_noise --clients 100 --cohort 20
--rounds 3 --out F.json``. In process (``tests.flower.inprocess.InProcessGrid``, the real
ClientApp; ``benchmarks.userlevel``'s run config and node policies). Each distributed node
sizes its share for ``--min-cohort`` honest survivors (no dropouts or colluders; default
⌈cohort / 2⌉, as ``simulations.mnist`` sets it); ``--noise`` picks the variants run.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.userlevel import _nodes, _run_config, build_parser, emit, parsed, torch_threads
from simulations._cli import Parser, at_least, even_or_zero, positive


def parser() -> Parser:
    p = build_parser()
    p.prog = "python -m benchmarks.userlevel_noise"
    p.add_argument("--noise", nargs="+", choices=["central", "distributed"], default=["central", "distributed"])
    p.add_argument("--min-cohort", type=at_least(1), help="each distributed node's min-cohort (⌈cohort / 2⌉)")
    p.add_argument("--clip-quantile", type=positive, help="adaptive clipping to this quantile (default: fixed S)")
    p.add_argument("--clip-lr", type=positive, default=0.2, help="adaptive clipping's learning rate η (0.2)")
    p.add_argument("--clip-warmup-rounds", type=at_least(0), default=0, metavar="W",
                   help="central adaptive clipping: the first W of --rounds release only the noisy count (0)")
    p.add_argument("--clip-warmup-lr", type=positive, default=1.0, help="η in those count-only rounds (1.0)")
    p.add_argument("--secagg-neighbours", type=even_or_zero, default=0, metavar="K",
                   help="distributed: SecAgg+ neighbours per node (even; 0: the full graph)")
    return p


def run(args: Any) -> dict[str, Any]:
    """Each ``--noise`` variant on ``--threads`` torch threads: accuracy per round, seconds
    per round, cohorts and ε."""
    with torch_threads(args.threads):
        return _variants(args)


def _variants(args: Any) -> dict[str, Any]:
    from flwr.serverapp import Grid

    from server.run import run_server
    from simulations._flower_private import task_identity
    from tests.flower.inprocess import InProcessGrid, consortium

    out: dict[str, Any] = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    for noise in args.noise:
        with tempfile.TemporaryDirectory(prefix="fedpriv-usernoise-") as tmp, task_identity(1, 1, 0):
            state = Path(tmp)
            config = {**_run_config(args, state), "user-noise": noise, "clip-quantile": args.clip_quantile or 0.0,
                      "clip-lr": args.clip_lr, "secagg-neighbours": args.secagg_neighbours,
                      "clip-warmup-rounds": args.clip_warmup_rounds, "clip-warmup-lr": args.clip_warmup_lr}
            nodes = _nodes(args, state)
            if noise == "distributed":  # the nodes of one consortium (a CA, an identity each)
                for policy, member in zip(nodes.values(), consortium(state / "consortium", len(nodes)), strict=True):
                    policy.update({"allow-central-user": False, "allow-distributed": True,
                                   "min-cohort": args.min_cohort or math.ceil(args.cohort / 2), **member})
                    if args.secagg_neighbours:
                        policy["min-secagg-neighbours"] = args.secagg_neighbours
            start = time.perf_counter()
            history = run_server(cast(Grid, InProcessGrid(config, nodes)), config)
            epsilon = list(history.final_epsilon().values())
            out[noise] = {"accuracy": [r.test_accuracy for r in history.rounds],
                          "train_seconds": [r.train_seconds for r in history.rounds],
                          "cohort_sizes": [len(r.participants) for r in history.rounds],
                          "discarded": [r.discarded for r in history.rounds],
                          "user_clip": [r.train_metrics.get("user_clip") for r in history.rounds],
                          "epsilon_median": statistics.median(epsilon), "seconds": time.perf_counter() - start}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parsed(parser(), argv)
    return emit(run(args), args.out)


if __name__ == "__main__":
    main()
