"""Privacy you can check: ``python -m simulations.audit {dpsgd,mechanism,figure}``.

- ``dpsgd --canaries m --target-epsilon E [--clients K] [--privacy local|distributed|user] --out F.json
  [--plot P.png]``: two parts (``--parts``). One training run with m canaries, each in by a
  fair coin the auditor keeps, and an ε lower bound at 95 % confidence (``fedpriv.audit.dpsgd``);
  and, in local mode, a white-box step audit of the engine (``fedpriv.audit.steps``): canary
  gradients inserted in known steps, the per-step Gaussian-DP μ bounded at 1 − 1e-4. It
  prints each part's bound and a verdict line ("flagged" in the JSON: some part rejects the
  claim at its confidence). ``--unsafe-noise-multiplier X`` trains with σ = X while the claim
  keeps the calibrated σ: the negative control (said in red on stderr and written into the
  JSON); so do the hidden ``--bug-noise-scale`` and ``--bug-clip-scale``, which run the engine
  with a noise or a clipping bug (``fedpriv.audit.bugs``) to measure that the audit finds them.
- ``mechanism NAME --epsilon E --trials n --out F.json``: a black-box audit of one releasing
  mechanism (``fedpriv.audit.mechanisms``); ``--noise-factor 0.5``: its half-noise variant.
- ``figure --out F.json --plot P.png``: the lower bound against the claimed ε for
  ε ∈ {0.5, 1, 2, 4, 8}, with the no-noise control.

An audit gives a lower bound, never a guarantee (``docs/audit.md``). It runs on its own
copies: it reads its data, and no node, policy or ledger is involved.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulations._cli import Parser, at_least, delta, non_negative, positive, probability, report_json, write_out

PROG = "python -m simulations.audit"
FIGURE_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
RED, RESET = "\033[31m", "\033[0m"
PART_CHOICES = {"all": frozenset({"one-run", "white-box"}), "one-run": frozenset({"one-run"}),
                "white-box": frozenset({"white-box"})}
"""``--parts``: which of ``fedpriv.audit.canary_audit.PARTS`` run."""
MODELS = ("cnn", "mlp", "scatter_linear", "scatter_cnn")
"""The MNIST models (``fedpriv.models``)."""
MECHANISMS = ("laplace", "linreg", "kmeans-dplloyd", "kmeans-init", "kmeans-input", "iris-output", "dppca",
              "distributed-noise", "count", "evaluation")
"""``fedpriv.audit.mechanism_cases.CASES``' names (checked by a test), here so a bad name is one line at once."""


def _training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--canaries", type=at_least(2), default=1000, help="canaries m (default: 1000)")
    p.add_argument("--model", choices=MODELS, default="cnn", help="model trained beside the canaries (default: cnn)")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the coins, the model and the noise")
    p.add_argument("--data-dir", help="folder holding MNIST (default: the cache folder)")
    p.add_argument("--train-size", type=at_least(1), default=1000, help="real MNIST examples (default: 1000)")
    p.add_argument("--epochs", type=at_least(1), default=5, help="epochs, or rounds of one local epoch (default: 5)")
    p.add_argument("--sample-rate", type=probability, default=0.1, help="Poisson rate q (default: 0.1)")
    p.add_argument("--delta", type=delta, default=1e-5, help="δ of the claim and of the bound (default: 1e-5)")


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    d = commands.add_parser("dpsgd", help="one-run canary audit of DP-SGD training")
    d.add_argument("--target-epsilon", type=positive, required=True, help="the claimed ε the noise is calibrated for")
    d.add_argument("--clients", type=at_least(1), help="federated local mode with K clients (default: centralized)")
    d.add_argument("--privacy", choices=["local", "distributed", "user"], default="local",
                   help="the privacy mode audited (default: local); user: K real clients and m canary clients, "
                        "--sample-rate the clients' q")
    d.add_argument("--canary-type", choices=["gradient", "input"], default="gradient",
                   help="white-box Dirac gradient canaries (default) or input-space ones")
    d.add_argument("--unsafe-noise-multiplier", type=non_negative, metavar="X",
                   help="NEGATIVE CONTROL: train with σ = X while claiming the calibrated σ")
    d.add_argument("--parts", choices=PART_CHOICES, default="all",
                   help="one-run, white-box (the engine's steps, local mode) or all (default)")
    d.add_argument("--bug-noise-scale", type=positive, default=1.0, help=argparse.SUPPRESS)
    d.add_argument("--bug-clip-scale", type=positive, default=1.0, help=argparse.SUPPRESS)
    _training_flags(d)
    d.add_argument("--out", type=Path, required=True, help="the result (JSON)")
    d.add_argument("--plot", type=Path, help="a histogram of the canaries' scores, in against out")
    m = commands.add_parser("mechanism", help="black-box audit of one releasing mechanism")
    m.add_argument("name", choices=MECHANISMS)
    m.add_argument("--epsilon", type=positive, required=True, help="the ε the mechanism is run for")
    m.add_argument("--trials", type=at_least(10), help="runs per neighbouring input (default: the mechanism's)")
    m.add_argument("--noise-factor", type=probability, default=1.0,
                   help="NEGATIVE CONTROL below 1: that fraction of the noise, the claim unchanged")
    m.add_argument("--seed", type=at_least(0), default=0)
    m.add_argument("--out", type=Path, required=True, help="the result (JSON)")
    f = commands.add_parser("figure", help="lower bound against claimed ε, with the no-noise control")
    _training_flags(f)
    f.add_argument("--out", type=Path, required=True, help="every number drawn (JSON)")
    f.add_argument("--plot", type=Path, required=True, help="the figure (PNG)")
    return parser


def _report(parser: argparse.ArgumentParser, out: Path, compute: Callable[[], dict[str, Any]],
            summary: Callable[[dict[str, Any]], list[str]]) -> dict[str, Any]:
    """Run ``compute`` (a bad value found on the way is one ``parser.error`` line), write the
    JSON to ``out`` and print ``summary``'s lines, the verdict last."""
    from fedpriv.data import DatasetNotFoundError

    try:
        result = compute()
    except (DatasetNotFoundError, ValueError) as err:
        parser.error(str(err))
    write_out(out, json.dumps(result, indent=2))
    print("\n".join([*summary(result), f"result: {out}"]))
    return result


def mechanism_summary(result: dict[str, Any]) -> list[str]:
    """The claim, the bound and a verdict line."""
    return [f"{result['mechanism']}: {result['description']}",
            f"  claimed ε = {result['claimed_epsilon']:.4f} at δ = {result['delta']:g}; lower bound "
            f"ε ≥ {result['epsilon_lower_bound']:.4f} ({result['confidence']:.0%}, {result['trials']} runs per input)",
            "verdict: FLAGGED: the lower bound exceeds the claim: the mechanism or its accounting is broken"
            if result["flagged"] else
            "verdict: not flagged: the lower bound stays at or below the claim (this proves no privacy: "
            "docs/audit.md)"]


def _setup(args: argparse.Namespace, **overrides: Any) -> Any:
    from fedpriv.audit.canary_audit import CanaryAudit

    values = dict(canaries=args.canaries, model=args.model, seed=args.seed, data_dir=args.data_dir,
                  train_size=args.train_size, epochs=args.epochs, sample_rate=args.sample_rate, delta=args.delta)
    return CanaryAudit(**{**values, **overrides})


def _dpsgd(args: argparse.Namespace) -> dict[str, Any]:
    from fedpriv.audit.bugs import EngineBug
    from fedpriv.audit.dpsgd import audit_dpsgd

    setup = _setup(args, target_epsilon=args.target_epsilon, clients=args.clients, canary_type=args.canary_type,
                   unsafe_noise_multiplier=args.unsafe_noise_multiplier, parts=PART_CHOICES[args.parts],
                   bug=EngineBug(args.bug_noise_scale, args.bug_clip_scale))
    result = audit_dpsgd(setup, args.privacy, _progress())
    scores = result.get("one_run", {}).pop("scores", None)
    if args.plot is not None and scores is not None:
        _scores_plot(result, scores, args.plot)
    return result


def _progress() -> Callable[[str], None]:
    """Progress lines on stderr, with the seconds since the start."""
    start = time.perf_counter()

    def report(message: str) -> None:
        print(f"[{time.perf_counter() - start:5.0f} s] {message}", file=sys.stderr, flush=True)

    return report


def dpsgd_summary(result: dict[str, Any]) -> list[str]:
    """What a newcomer reads: the claim, each part's bound against it, and a verdict line."""
    clients = f", {result['clients']} clients" if "clients" in result else ""
    lines = [f"DP-SGD audit ({result['mode']}{clients}): claimed ε = {result['claimed_epsilon']:.3f} at "
             f"δ = {result['delta']:g} (σ = {result['noise_multiplier']:.3g}, C = {result['max_grad_norm']:g}, "
             f"q = {result['sample_rate']:g}, {result['steps']} steps)"]
    bug, unsafe = result.get("injected_bug"), result.get("unsafe_noise_multiplier")
    if bug is not None:
        lines.append(f"  NEGATIVE CONTROL: the engine runs with its noise × {bug['noise_scale']:g} and its clipping "
                     f"bound × {bug['clip_scale']:g}")
    if unsafe is not None:
        lines.append(f"  NEGATIVE CONTROL: trained with σ = {unsafe:g}")
    rejecting = []
    one_run = result.get("one_run")
    if one_run is not None:
        lines.append(f"  one-run ({one_run['confidence']:.0%}): ε ≥ {one_run['epsilon_lower_bound']:.3f} from "
                     f"{one_run['correct']} of {one_run['guesses']} guesses right ({one_run['canaries']} canaries): "
                     + ("REJECTS the claim" if one_run["flagged"] else "consistent with the claim"))
        if one_run["flagged"]:
            rejecting.append("one-run")
    box = result["white_box"]
    if "skipped" in box:
        lines.append(f"  white-box: not run ({box['skipped']})")
    else:
        mu = "∞ (no noise)" if box["mu_lower_bound"] is None else f"{box['mu_lower_bound']:.3f}"
        lines.append(f"  white-box ({box['confidence']:.2%}): per-step μ ≥ {mu} against the "
                     f"claimed {box['mu_claimed']:.3f} (noise σ ≤ {box['noise_multiplier_upper_bound']:.3g}, "
                     f"estimate {box['noise_multiplier_estimate']:.3g}; clipped canary norm ≥ "
                     f"{box['clipped_norm_lower_bound']:.3g}, estimate {box['clipped_norm_estimate']:.3g}): "
                     + ("REJECTS the claim" if box["flagged"] else "consistent with the claim"))
        if box["flagged"]:
            rejecting.append("white-box")
    if rejecting:
        lines.append(f"verdict: FLAGGED: {' and '.join(rejecting)} "
                     f"{'reject' if len(rejecting) > 1 else 'rejects'} the claimed ε at the stated confidence: "
                     "the code or its accounting is broken")
    else:
        lines.append("verdict: not flagged: no part rejects the claimed ε (an audit that flags nothing proves no "
                     "privacy: docs/audit.md)")
    return lines


def _figure(args: argparse.Namespace) -> dict[str, Any]:
    from fedpriv.audit.dpsgd import audit_dpsgd

    rows = []
    for epsilon in FIGURE_EPSILONS:
        for unsafe in (None, 0.0):
            result = audit_dpsgd(_setup(args, target_epsilon=epsilon, unsafe_noise_multiplier=unsafe,
                                        parts=PART_CHOICES["one-run"]))
            result["one_run"].pop("scores")
            rows.append(result)
            print(f"ε = {epsilon:g}{' (σ = 0)' if unsafe == 0 else ''}: lower bound "
                  f"{result['one_run']['epsilon_lower_bound']:.3f}", file=sys.stderr)
    _figure_plot(rows, args.plot)
    return {"epsilons": list(FIGURE_EPSILONS), "runs": rows}


def _scores_plot(result: dict[str, Any], scores: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    ax.hist([scores["in"], scores["out"]], bins=40, label=["canaries in", "canaries out"], alpha=0.8)
    one_run = result["one_run"]
    ax.set_xlabel("score (log-likelihood ratio)" if "gradient" in one_run["method"] else "score (−loss)")
    ax.set_ylabel("canaries")
    ax.set_title(f"claimed ε = {result['claimed_epsilon']:.2f}, lower bound {one_run['epsilon_lower_bound']:.2f} "
                 f"({result['mode']})", fontsize=9)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def _figure_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    safe = [r for r in rows if r["unsafe_noise_multiplier"] is None]
    control = [r for r in rows if r["unsafe_noise_multiplier"] is not None]
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    claimed = [r["claimed_epsilon"] for r in safe]
    ax.plot(claimed, claimed, "k--", label="claimed ε (upper bound)")
    ax.plot(claimed, [r["one_run"]["epsilon_lower_bound"] for r in safe], "o-", label="lower bound, calibrated noise")
    ax.plot(claimed, [r["one_run"]["epsilon_lower_bound"] for r in control], "s-", color="tab:red",
            label="lower bound, no noise (σ = 0) claiming ε")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("claimed ε")
    ax.set_ylabel("ε lower bound (95 %)")
    first = safe[0]
    ax.set_title(f"one-run audit, {first['one_run']['canaries']} canaries, δ = {first['delta']:g}", fontsize=9)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "dpsgd":
        if args.plot is not None and args.parts == "white-box":
            parser.error("--plot draws the one-run part's scores: run it (--parts one-run or all)")
        if args.unsafe_noise_multiplier is not None:
            print(f"{RED}NEGATIVE CONTROL: training with noise multiplier {args.unsafe_noise_multiplier:g}, "
                  f"less than the accountant books: this run is NOT private{RESET}", file=sys.stderr)
        return _report(parser, args.out, lambda: _dpsgd(args), dpsgd_summary)
    if args.command == "mechanism":
        from fedpriv.audit.mechanisms import audit_mechanism

        if args.noise_factor < 1:
            print(f"{RED}NEGATIVE CONTROL: {args.name} with {args.noise_factor:g} of its noise{RESET}", file=sys.stderr)
        return _report(parser, args.out, lambda: audit_mechanism(args.name, args.epsilon, args.trials, args.seed,
                                                                 args.noise_factor), mechanism_summary)
    return report_json(parser, args.out, lambda: _figure(args))


if __name__ == "__main__":
    main()
