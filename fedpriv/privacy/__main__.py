"""``python -m fedpriv.privacy epsilon|sigma|ledger show|plan``: one JSON object (or, for
``ledger show`` and ``plan``, a table) on stdout; invalid input, and an ε no σ reaches, give one
line on stderr and exit 2.
``plan`` is ``python -m fedpriv.planning``'s, delegated to (the planner sits above accounting)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from fedpriv.cli import Parser, count, number
from fedpriv.privacy.accountants import AccountantKind, epsilon_of
from fedpriv.privacy.calibration import calibrate_noise_multiplier
from fedpriv.privacy.events import MIN_SAMPLE_RATE, dpsgd_event
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.ledger_json import LedgerError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m fedpriv.privacy", description="Privacy accounting for DP-SGD.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    common = Parser(add_help=False)
    common.add_argument("--accountant", choices=[k.value for k in AccountantKind], default="rdp")
    common.add_argument("--sample-rate", type=number("sample rate", lambda q: MIN_SAMPLE_RATE <= q <= 1,
                                                      "in [2^-33, 1] (what the Poisson samplers draw)"), required=True)
    common.add_argument("--steps", type=count("steps", minimum=0), required=True)
    common.add_argument("--delta", type=number("delta", lambda d: 0 < d < 1, "in (0, 1)"), required=True)
    eps = sub.add_parser("epsilon", parents=[common], help="epsilon of DP-SGD at (sigma, q, steps, delta)")
    eps.add_argument("--noise-multiplier", type=number("noise multiplier", lambda s: s > 0, "> 0"), required=True)
    sig = sub.add_parser("sigma", parents=[common], help="smallest sigma (3 sig. digits) reaching epsilon")
    sig.add_argument("--epsilon", type=number("epsilon", lambda e: e > 0, "> 0"), required=True)
    ledger = sub.add_parser("ledger", help="inspect a saved privacy ledger")
    show = ledger.add_subparsers(dest="ledger_command", required=True, parser_class=Parser)
    show_parser = show.add_parser("show", help="table per client: entries, events, spent, budget, remaining")
    show_parser.add_argument("path")
    show_parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    sub.add_parser("plan", add_help=False, help="each privacy mode's noise, epsilon per round and noise-to-signal "
                                                "for a federation's shape (python -m fedpriv.planning)")
    return parser


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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"]:  # the planner sits above accounting (training, distributed): the command delegates
        from fedpriv.planning.__main__ import main as plan

        return plan(argv[1:], prog="python -m fedpriv.privacy plan")
    parser = build_parser()
    args = parser.parse_args(argv)
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
