"""What a round of a user's task costs per example, beside the built-in MNIST task's.

``python -m benchmarks.task_round [--app APP_DIR] [--repeats 3] [--threads 1] [--clock cpu] --out FILE``

One local round (``fedpriv.training.train_round``, one epoch, the physical batch measured
for the device, seeded lots and noise) of the tabular template (``python -m fedpriv new``,
its ``RUN_CONFIG``'s lot, C and LR; its whole train set) and of MNIST's default plan
(ScatterNet+linear on cached scattering features of ``--mnist-records`` training images).
Per example = the round's wall time / the examples its lots held. The two alternate
``repeats`` times and the fastest of each is kept (the machine is shared); on a crowded
machine ``--threads 1 --clock cpu`` (process CPU time of one thread) gives steadier numbers:
with more threads than free cores, the tabular model's tiny ops are dominated by threads
waiting on one another.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from simulations._cli import Parser, at_least, write_out


def _timed(clock: str, run: Callable[[], int]) -> float:
    """Seconds per example of ``run`` (which returns how many examples it processed)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    start = now()
    examples = run()
    return (now() - start) / examples


def tabular_round(app: Path) -> Callable[[], int]:
    from fedpriv.task import load_task
    from fedpriv.templates.tabular import RUN_CONFIG
    from fedpriv.training import TrainingPlan, train_round

    task = load_task("task", app)
    train, _ = task.load(0, 1, app / "data")
    plan = TrainingPlan(model="task", lot_size=int(RUN_CONFIG["lot-size"]), max_grad_norm=RUN_CONFIG["max-grad-norm"],
                        noise_multiplier=1.0, lr=RUN_CONFIG["lr"])

    def run() -> int:
        report = train_round(task.build_model(0), train.features, train.labels, plan, seed=0, client=0, round_=1,
                             device="cpu", loss_fn=task.loss)
        return round(plan.sample_rate(len(train.labels)) * len(train.labels) * report.steps)

    return run


def mnist_round(data_dir: Path | None, records: int) -> Callable[[], int]:
    from fedpriv.data import load_dataset
    from fedpriv.models import build_model, model_inputs
    from fedpriv.training import default_plan, train_round

    data = load_dataset("mnist", data_dir, train=True, limit=records)
    plan = default_plan("mnist")
    features = model_inputs(plan.model, data.features)
    plan = dataclasses.replace(plan, lot_size=min(plan.lot_size, records // 4))

    def run() -> int:
        report = train_round(build_model(plan.model, 0), features, data.labels, plan, seed=0, client=0, round_=1,
                             device="cpu")
        return round(plan.sample_rate(records) * records * report.steps)

    return run


def measure(app: Path, data_dir: Path | None, records: int, repeats: int, clock: str) -> dict[str, Any]:
    rounds = {"tabular": tabular_round(app), "mnist": mnist_round(data_dir, records)}
    times: dict[str, list[float]] = {name: [] for name in rounds}
    for _ in range(repeats):
        for name, run in rounds.items():
            times[name].append(_timed(clock, run))
    best = {name: min(values) for name, values in times.items()}
    return {"clock": clock, "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "seconds_per_example": best, "all": times, "tabular_over_mnist": best["tabular"] / best["mnist"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = Parser(prog="python -m benchmarks.task_round", description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", type=Path, help="a tabular app (default: one written to a temporary folder)")
    parser.add_argument("--data-dir", type=Path, help="MNIST's folder (default: the cache folder)")
    parser.add_argument("--mnist-records", type=at_least(16), default=8192)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--threads", type=at_least(1), help="torch's threads (default: torch's own)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fedpriv-task-round-") as folder:
        app = args.app
        if app is None:
            from fedpriv.new import new_app

            app = new_app(Path(folder) / "tabular", "tabular")
        result = measure(app, args.data_dir, args.mnist_records, args.repeats, args.clock)
    text = json.dumps(result, indent=2)
    write_out(args.out, text)
    print(text)
    return result


if __name__ == "__main__":
    main()
