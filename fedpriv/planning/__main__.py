"""``python -m fedpriv.planning`` (also ``python -m fedpriv.privacy plan``): each privacy mode's
noise, ε per round and noise-to-signal for a federation's shape, as a table and what its rows
mean (``--out``: JSON, ``--plot``: PNG); reads no data and no ledger; invalid input, and a fixed
σ that affords no round in any mode planned, give one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from fedpriv.cli import Parser, count, number
from fedpriv.model_names import MODELS
from fedpriv.planning.planner import PLANNERS, Federation, plan, plot, table
from fedpriv.privacy.accountants import AccountantKind


def build_parser(prog: str = "python -m fedpriv.planning") -> argparse.ArgumentParser:
    plan = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    plan.add_argument("--privacy", action="append", choices=["local", "distributed", "user", "user-distributed"],
                      help="a mode to plan (repeat for several; default: all, side by side)")
    plan.add_argument("--population", type=count("population"), required=True, help="clients in the federation")
    plan.add_argument("--cohort", type=count("cohort"), help="clients per round (default: all)")
    plan.add_argument("--rounds", type=count("rounds"), required=True,
                      help="the run's --rounds (distributed mode: DP-SGD steps, one a round)")
    sizes = plan.add_mutually_exclusive_group()
    sizes.add_argument("--records-per-client", type=count("records per client"), metavar="N")
    sizes.add_argument("--data-sizes", metavar="FILE", help="each client's number of records (a JSON list, or "
                                                            "whitespace-separated integers)")
    plan.add_argument("--lot-size", type=count("lot size"),
                      help="each client's expected lot, the union's in distributed mode (default: as the server "
                           "does, the data set's lot shared out; distributed: ΣN / 3)")
    plan.add_argument("--local-epochs", type=count("local epochs"), default=1)
    plan.add_argument("--target-epsilon", type=number("target epsilon", lambda e: e > 0, "> 0"))
    plan.add_argument("--noise-multiplier", type=number("noise multiplier", lambda s: s > 0, "> 0"),
                      help="a fixed sigma (z for user level): the rounds it affords at --target-epsilon")
    plan.add_argument("--delta", type=number("delta", lambda d: 0 < d < 1, "in (0, 1)"), required=True)
    plan.add_argument("--clip-warmup-rounds", type=count("count-only rounds", minimum=0), default=0, metavar="W",
                      help="user level, adaptive clipping: the first W of --rounds release only the noisy count")
    plan.add_argument("--clip-count-noise", type=number("clip-count-noise", lambda s: s > 0, "> 0"),
                      help="σ_b of the noisy count (default: max(cohort / 20, z), as the server sets it)")
    plan.add_argument("--accountant", choices=[k.value for k in AccountantKind], default="rdp")
    plan.add_argument("--dataset", choices=["mnist", "cifar10"], default="mnist", help="whose default plan (local)")
    plan.add_argument("--out", metavar="F.json", help="also write the plan as JSON")
    plan.add_argument("--plot", metavar="P.png", help="also plot epsilon per round of each mode")
    plan.add_argument("--model", choices=MODELS, help="the run's --model (default: the data set's); "
                                                                   "its size sets the distributed modes' lattice")
    plan.add_argument("--max-grad-norm", type=number("max grad norm", lambda c: c > 0, "> 0"),
                      help="the run's C (default: the data set's): the distributed lattice's scale")
    plan.add_argument("--user-clip", type=number("user clip", lambda s: s > 0, "> 0"), default=1.0,
                      help="S of user level (default 1): the distributed user-level lattice's scale")
    plan.add_argument("--lattice-rounding", choices=["nearest", "conditional"], default="nearest")
    return plan


def _data_sizes(path: str) -> tuple[int, ...]:
    """Records per client from a file: a JSON list or whitespace-separated integers."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        values = json.loads(text) if text.lstrip().startswith("[") else [int(v) for v in text.split()]
    except ValueError as err:
        raise ValueError(f"--data-sizes {path}: not a JSON list or integers ({err})") from None
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ValueError(f"--data-sizes {path}: needs one integer >= 1 per client")
    return tuple(values)


def no_round_affordable(result: dict[str, Any]) -> list[str]:
    """The planned modes whose noise affords not one round within the target ε, each with ε
    after its first round (``local: epsilon 10.17 after one round``)."""
    return [f"{m['mode']}: epsilon {m['epsilon'][0]:.4g} after one round" for m in result["modes"].values()
            if m["available"] and m["rounds_affordable"] == 0]


def plan_notes(result: dict[str, Any]) -> list[str]:
    """What the plan's rows mean, for the modes in it: a reader of the table needs no docstring."""
    modes = {m["mode"]: m for m in result["modes"].values() if m["available"]}
    units: dict[str, list[str]] = {}
    for name, m in modes.items():  # "C per example, per DP-SGD step (one step per round)": its first part
        units.setdefault(m["unit"].split(" (")[0], []).append(name)
    bounds = "; ".join(", ".join(names) + f": {unit}" for unit, names in units.items())
    notes = ["noise-to-signal: the std of the noise in the aggregated update, per coordinate, in units of one "
             f"contribution's bound ({bounds}), for a cohort of clients of the mean size; the lower, the more the "
             "model learns per round."]
    if "distributed" in modes:
        local = modes.get("local")
        notes.append("distributed takes one DP-SGD step per round, on one lot of about "
                     f"{modes['distributed']['lot_size']} records drawn from all clients' data: its rounds planned "
                     "are DP-SGD steps" + (f", where a round of local mode is {local['steps_per_round']} steps on each "
                                           "client" if local else "") + ".")
    return notes


def main(argv: list[str] | None = None, prog: str = "python -m fedpriv.planning") -> int:
    logging.getLogger("absl").setLevel(logging.ERROR)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        sizes = _data_sizes(args.data_sizes) if args.data_sizes else \
            (args.records_per_client,) * args.population if args.records_per_client else ()
        if sizes and len(sizes) != args.population:
            raise ValueError(f"--data-sizes holds {len(sizes)} clients, --population is {args.population}")
        fed = Federation(population=args.population, rounds=args.rounds, delta=args.delta, cohort=args.cohort,
                         sizes=sizes, lot_size=args.lot_size, local_epochs=args.local_epochs,
                         target_epsilon=args.target_epsilon, noise_multiplier=args.noise_multiplier,
                         dataset=args.dataset, accountant=AccountantKind(args.accountant),
                         count_rounds=args.clip_warmup_rounds, count_noise=args.clip_count_noise, model=args.model,
                         max_grad_norm=args.max_grad_norm, user_clip=args.user_clip,
                         lattice_rounding=args.lattice_rounding)
        result = plan(fed, args.privacy or tuple(PLANNERS))
    except (OSError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if none := no_round_affordable(result):
        line = (f"noise multiplier {args.noise_multiplier:g} affords no round within target epsilon "
                f"{args.target_epsilon:g} ({', '.join(none)})")
        if len(none) == sum(m["available"] for m in result["modes"].values()):
            parser.exit(2, f"{parser.prog}: error: {line}: raise --noise-multiplier or --target-epsilon\n")
        print(f"{parser.prog}: warning: {line}", file=sys.stderr)
    print("\n".join([table(result), *plan_notes(result)]))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
