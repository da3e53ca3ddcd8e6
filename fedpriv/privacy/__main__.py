"""``python -m fedpriv.privacy epsilon|sigma|ledger show|plan``: one JSON object (or, for
``ledger show`` and ``plan``, a table and what its rows mean) on stdout; invalid input, an ε
no σ reaches and a fixed σ that affords no round give one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fedpriv.privacy.accountants import AccountantKind, epsilon_of
from fedpriv.privacy.calibration import calibrate_noise_multiplier
from fedpriv.privacy.events import MIN_SAMPLE_RATE, dpsgd_event
from fedpriv.privacy.ledger import LedgerError, PrivacyLedger


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(name: str, valid: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not (math.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fedpriv.privacy", description="Privacy accounting for DP-SGD.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--accountant", choices=[k.value for k in AccountantKind], default="rdp")
    common.add_argument("--sample-rate", type=_number("sample rate", lambda q: MIN_SAMPLE_RATE <= q <= 1,
                                                      "in [2^-33, 1] (what the Poisson samplers draw)"), required=True)
    common.add_argument("--steps", type=_count("steps", minimum=0), required=True)
    common.add_argument("--delta", type=_number("delta", lambda d: 0 < d < 1, "in (0, 1)"), required=True)
    eps = sub.add_parser("epsilon", parents=[common], help="epsilon of DP-SGD at (sigma, q, steps, delta)")
    eps.add_argument("--noise-multiplier", type=_number("noise multiplier", lambda s: s > 0, "> 0"), required=True)
    sig = sub.add_parser("sigma", parents=[common], help="smallest sigma (3 sig. digits) reaching epsilon")
    sig.add_argument("--epsilon", type=_number("epsilon", lambda e: e > 0, "> 0"), required=True)
    ledger = sub.add_parser("ledger", help="inspect a saved privacy ledger")
    show = ledger.add_subparsers(dest="ledger_command", required=True, parser_class=_Parser)
    show_parser = show.add_parser("show", help="table per client: entries, events, spent, budget, remaining")
    show_parser.add_argument("path")
    show_parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    _add_plan(sub)
    return parser


def _count(name: str, minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, or one line naming ``name``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {text}")
        return value

    return parse


def _add_plan(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="each privacy mode's noise, epsilon per round and noise-to-signal for a "
                                       "federation's shape (reads no data and no ledger)")
    plan.add_argument("--privacy", action="append", choices=["local", "distributed", "user", "user-distributed"],
                      help="a mode to plan (repeat for several; default: all, side by side)")
    plan.add_argument("--population", type=_count("population"), required=True, help="clients in the federation")
    plan.add_argument("--cohort", type=_count("cohort"), help="clients per round (default: all)")
    plan.add_argument("--rounds", type=_count("rounds"), required=True)
    sizes = plan.add_mutually_exclusive_group()
    sizes.add_argument("--records-per-client", type=_count("records per client"), metavar="N")
    sizes.add_argument("--data-sizes", metavar="FILE", help="each client's number of records (a JSON list, or "
                                                            "whitespace-separated integers)")
    plan.add_argument("--lot-size", type=_count("lot size"), help="each client's expected lot (default: the data "
                                                                  "set's lot shared out, as the server does)")
    plan.add_argument("--local-epochs", type=_count("local epochs"), default=1)
    plan.add_argument("--target-epsilon", type=_number("target epsilon", lambda e: e > 0, "> 0"))
    plan.add_argument("--noise-multiplier", type=_number("noise multiplier", lambda s: s > 0, "> 0"),
                      help="a fixed sigma (z for user level): the rounds it affords at --target-epsilon")
    plan.add_argument("--delta", type=_number("delta", lambda d: 0 < d < 1, "in (0, 1)"), required=True)
    plan.add_argument("--clip-warmup-rounds", type=_count("count-only rounds", minimum=0), default=0, metavar="W",
                      help="user level, adaptive clipping: the first W of --rounds release only the noisy count")
    plan.add_argument("--clip-count-noise", type=_number("clip-count-noise", lambda s: s > 0, "> 0"),
                      help="σ_b of the noisy count (default: max(cohort / 20, z), as the server sets it)")
    plan.add_argument("--accountant", choices=[k.value for k in AccountantKind], default="rdp")
    plan.add_argument("--dataset", choices=["mnist", "cifar10"], default="mnist", help="whose default plan (local)")
    plan.add_argument("--out", metavar="F.json", help="also write the plan as JSON")
    plan.add_argument("--plot", metavar="P.png", help="also plot epsilon per round of each mode")


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


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from fedpriv.privacy.planner import PLANNERS, Federation, plan, plot, table

    try:
        sizes = _data_sizes(args.data_sizes) if args.data_sizes else \
            (args.records_per_client,) * args.population if args.records_per_client else ()
        if sizes and len(sizes) != args.population:
            raise ValueError(f"--data-sizes holds {len(sizes)} clients, --population is {args.population}")
        fed = Federation(population=args.population, rounds=args.rounds, delta=args.delta, cohort=args.cohort,
                         sizes=sizes, lot_size=args.lot_size, local_epochs=args.local_epochs,
                         target_epsilon=args.target_epsilon, noise_multiplier=args.noise_multiplier,
                         dataset=args.dataset, accountant=AccountantKind(args.accountant),
                         count_rounds=args.clip_warmup_rounds, count_noise=args.clip_count_noise)
        result = plan(fed, args.privacy or tuple(PLANNERS))
    except (OSError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if none := no_round_affordable(result):
        modes = [m for m in result["modes"].values() if m["available"]]
        line = (f"noise multiplier {args.noise_multiplier:g} affords no round within target epsilon "
                f"{args.target_epsilon:g} ({', '.join(none)})")
        if len(none) == len(modes):
            parser.exit(2, f"{parser.prog}: error: {line}: raise --noise-multiplier or --target-epsilon\n")
        print(f"{parser.prog}: warning: {line}", file=sys.stderr)
    print(table(result))
    print("\n".join(plan_notes(result)))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


def no_round_affordable(result: dict[str, Any]) -> list[str]:
    """The planned modes whose noise affords not one round within the target ε, each with ε
    after its first round (``local 10.17``)."""
    return [f"{m['mode']}: epsilon {m['epsilon'][0]:.4g} after one round" for m in result["modes"].values()
            if m["available"] and m["rounds_affordable"] == 0]


def plan_notes(result: dict[str, Any]) -> list[str]:
    """What the plan's rows mean, for the modes in it: a reader of the table needs no docstring."""
    modes = {m["mode"]: m for m in result["modes"].values() if m["available"]}
    rounds = result["federation"]["rounds"]
    units: dict[str, list[str]] = {}
    for name, m in modes.items():  # "C per example, per DP-SGD step (one step per round)": its first part
        units.setdefault(m["unit"].split(" (")[0], []).append(name)
    bounds = "; ".join(", ".join(names) + f": {unit}" for unit, names in units.items())
    notes = ["noise-to-signal: the std of the noise in the aggregated update, per coordinate, in units of one "
             f"contribution's bound ({bounds}), "
             "for a cohort of clients of the mean size; the lower, the more the model learns per round."]
    if "distributed" in modes:
        per_round = len(modes["distributed"]["epsilon"]) // rounds
        notes.append(f"distributed takes one DP-SGD step per round, on lots drawn from all clients' data: its "
                     f"rounds planned are local mode's DP-SGD steps in {rounds} rounds ({per_round} per round), so "
                     "both columns train the same number of steps; an epsilon row names its round.")
    return notes


def _ledger_rows(ledger: PrivacyLedger) -> list[dict[str, object]]:
    return [
        {
            "client": c,
            "entries": len(ledger.entries(c)),
            "events": len(ledger.events(c)),
            "epsilon_spent": ledger.spent(c),
            "budget_epsilon": ledger.budget_for(c).epsilon,
            "budget_delta": ledger.budget_for(c).delta,
            "remaining": ledger.remaining(c),
        }
        for c in ledger.clients()
    ]


def _table(rows: list[dict[str, object]]) -> str:
    header = ["client", "entries", "events", "eps spent", "budget (eps, delta)", "remaining"]
    body = [
        [str(r["client"]), str(r["entries"]), str(r["events"]), f"{r['epsilon_spent']:.4f}",
         f"({r['budget_epsilon']:g}, {r['budget_delta']:g})", f"{r['remaining']:.4f}"]
        for r in rows
    ]
    lines = [header, *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("absl").setLevel(logging.ERROR)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "plan":
        return _plan(parser, args)
    if args.command == "ledger":
        try:
            ledger = PrivacyLedger.load(args.path)
            rows = _ledger_rows(ledger)
        except LedgerError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        if args.json:
            out: object = {"path": args.path, "accountant": ledger.accountant.value, "randomness": ledger.randomness,
                           "clients": rows}
            print(json.dumps(out))
        else:
            noise = "" if ledger.randomness is None else f", node randomness {ledger.randomness}"
            print(f"ledger {args.path} (accountant {ledger.accountant.value}{noise})\n{_table(rows)}")
        return 0
    base = {"accountant": args.accountant}
    if args.command == "epsilon":
        event = dpsgd_event(args.noise_multiplier, args.sample_rate, args.steps)
        out = base | {"epsilon": epsilon_of(event, args.delta, args.accountant), "delta": args.delta,
                      "sample_rate": args.sample_rate, "noise_multiplier": args.noise_multiplier, "steps": args.steps}
    else:
        if args.steps == 0:
            parser.error("steps must be >= 1 to calibrate, got 0")
        try:
            sigma = calibrate_noise_multiplier(args.epsilon, args.delta, args.sample_rate, args.steps,
                                               args.accountant)
        except ValueError as err:  # no σ the search covers reaches ε
            parser.exit(2, f"{parser.prog}: error: {err} at sample rate {args.sample_rate:g}, {args.steps} steps "
                           f"and delta {args.delta:g} ({args.accountant}): raise --epsilon or lower the steps\n")
        achieved = epsilon_of(dpsgd_event(sigma, args.sample_rate, args.steps), args.delta, args.accountant)
        out = base | {"noise_multiplier": sigma, "epsilon": args.epsilon, "achieved_epsilon": achieved,
                      "delta": args.delta, "sample_rate": args.sample_rate, "steps": args.steps}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
