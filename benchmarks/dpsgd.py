"""DP-SGD throughput: samples/s of one training step, fedpriv vs non-private vs Opacus.

``python -m benchmarks.dpsgd [--quick] --out FILE``

One step = forward + backward + (clip + noise) + optimizer step on a fixed in-memory batch of
256 MNIST-shaped random examples.  Every implementation trains the zoo's model as
``build_model`` makes it (the CNN in channels_last: all get the same kernels).  fedpriv runs
``train_dpsgd`` on a 256-example set with q = 1, so every Poisson lot is the whole batch
(sampling and gathering included); Opacus runs ``make_private`` without Poisson sampling on
the same tensors, in each of its modes.  On CUDA fedpriv's step is captured in CUDA graphs
(``fedpriv.dpsgd.static``) and ``fedpriv_eager`` is the same step uncaptured.
Each implementation is built once per model and warmed up; then they run interleaved
(round-robin, the order rotating each round), ``Schedule.rounds`` rounds of one timed chunk
each, a chunk being as many steps as fill ``Schedule.chunk_s``.  Each reports the median of its chunks'
rates and their spread ((max − min) / median; ratios come from the medians): a shared
machine slows whichever chunk it hits, and interleaving spreads that over all of them
instead of one implementation.  ``breakdown`` then says where fedpriv's step time goes: each
model's steps run under ``torch.profiler``, summed over the engine's labelled stages
(``fedpriv.dpsgd.engine.STAGES``: lot, noise, clipped sum, update), beside the
non-private step's time from the same profile.  On a crowded machine ``--threads 1 --clock cpu`` (process CPU
time instead of wall time) gives steadier ratios; samples_per_s is then per CPU-second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import DeviceType

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.config import GradSampleMode
from fedpriv.dpsgd.engine import STAGES
from fedpriv.models import build_model
from simulations._cli import Parser, at_least

BATCH = 256
MODELS = ("mlp", "cnn")
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")
SIGMA, CLIP, LR = 1.0, 1.0, 0.05

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

StepRunner = Callable[[int], None]
"""``run(n)`` performs n training steps."""


def non_private(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> StepRunner:
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def run(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

    return run


ImplementationFactory = Callable[[nn.Module, torch.Tensor, torch.Tensor], StepRunner]


def fedpriv(mode: str, static_shapes: bool | None = None) -> ImplementationFactory:
    def make(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> StepRunner:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        config = DPSGDConfig(
            SIGMA, CLIP, sample_rate=1.0, max_physical_batch_size=BATCH, grad_sample_mode=GradSampleMode(mode)
        )
        sampling, noise = (torch.Generator(device=x.device).manual_seed(s) for s in (1, 2))

        def run(n: int) -> None:
            train_dpsgd(model, x, y, config=config, steps=n, optimizer=opt,
                        sampling_generator=sampling, noise_generator=noise, static_shapes=static_shapes)

        return run

    return make


def opacus(mode: str) -> ImplementationFactory:
    def make(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> StepRunner:
        from opacus import PrivacyEngine

        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
        engine = PrivacyEngine()
        private = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), data_loader=loader,
            criterion=nn.CrossEntropyLoss(), noise_multiplier=SIGMA, max_grad_norm=CLIP,
            poisson_sampling=False, grad_sample_mode=mode,
        )
        if mode == "ghost":
            wrapped, opt, criterion, _ = private
        else:
            (wrapped, opt, _), criterion = private, nn.CrossEntropyLoss()

        def run(n: int) -> None:
            for _ in range(n):
                opt.zero_grad(set_to_none=True)
                criterion(wrapped(x), y).backward()
                opt.step()

        return run

    return make


IMPLEMENTATIONS: dict[str, ImplementationFactory] = {
    "nonprivate": non_private,
    "fedpriv": fedpriv("auto"),
    "fedpriv_vmap": fedpriv("vmap"),
    "fedpriv_eager": fedpriv("auto", static_shapes=False),  # on CUDA only: "fedpriv" is captured there
    **{f"opacus_{mode}": opacus(mode) for mode in OPACUS_MODES},
}


@dataclass(frozen=True)
class Schedule:
    """How long each implementation runs: warm-up seconds (at least ``WARMUP_STEPS`` steps),
    rounds of the interleaved loop, seconds per timed chunk (at least one step)."""

    warmup_s: float
    rounds: int
    chunk_s: float


QUICK, FULL = Schedule(warmup_s=0.5, rounds=7, chunk_s=0.15), Schedule(warmup_s=1.5, rounds=15, chunk_s=0.4)
WARMUP_STEPS = 2


def steps_for(run: StepRunner, schedule: Schedule, device: torch.device, clock: Callable[[], float]) -> int:
    """Warm ``run`` up (``WARMUP_STEPS`` steps, then more until ``warmup_s`` has passed);
    the steps one timed chunk of ``chunk_s`` holds, at least 1."""
    start, steps = clock(), 0
    while steps < WARMUP_STEPS or clock() - start < schedule.warmup_s:
        step_start = clock()
        run(1)
        _sync(device)
        per_step = clock() - step_start
        steps += 1
    return max(1, round(schedule.chunk_s / max(per_step, 1e-9)))


def interleaved_rates(
    runs: dict[str, tuple[StepRunner, int]], rounds: int, device: torch.device, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Samples/s of each chunk: ``rounds`` rounds, each running every implementation's chunk
    once, the order rotated by one each round (no implementation always follows another)."""
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            run, steps = runs[name]
            start = clock()
            run(steps)
            _sync(device)
            rates[name].append(BATCH * steps / (clock() - start))
    return rates


def summary(rates: list[float]) -> dict[str, float]:
    """Median samples/s of the chunks and their spread, (max − min) / median."""
    median = statistics.median(rates)
    return {"samples_per_s": round(median, 1), "spread": round((max(rates) - min(rates)) / median, 3),
            "chunks": len(rates)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def benchmark(quick: bool, clock: Callable[[], float]) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    schedule = QUICK if quick else FULL
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (BATCH,), generator=gen).to(device)
    cases: list[dict[str, Any]] = []
    medians: dict[tuple[str, str], float] = {}
    for model_name in MODELS:
        runs: dict[str, tuple[StepRunner, int]] = {}
        for impl, make in IMPLEMENTATIONS.items():
            if impl == "fedpriv_eager" and device.type != "cuda":
                continue
            try:
                run = make(build_model(model_name, seed=0).to(device), x, y)
                runs[impl] = (run, steps_for(run, schedule, device, clock))
            except Exception as err:  # an Opacus mode that does not apply: record, go on
                cases.append({"model": model_name, "impl": impl, "samples_per_s": None,
                              "skipped": f"{type(err).__name__}: {err}"[:300]})
        for impl, rates in interleaved_rates(runs, schedule.rounds, device, clock).items():
            cases.append({"model": model_name, "impl": impl, **summary(rates)})
            medians[(model_name, impl)] = cases[-1]["samples_per_s"]
    breakdown = {m: stage_breakdown(m, x, y, device) for m in MODELS}
    return {"device": _device_name(device), "cases": cases, "ratios": {m: _ratios(medians, m) for m in MODELS},
            "breakdown": breakdown}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


PROFILED_STEPS = 20


def stage_breakdown(
    model_name: str, x: torch.Tensor, y: torch.Tensor, device: torch.device, steps: int = PROFILED_STEPS
) -> dict:
    """ms per step of each fedpriv stage and of the non-private step, from one profile of
    ``steps`` steps of each (after a warm-up); profiling adds a little to both.  On CUDA also
    the ``gpu_ms`` of the kernels each launched: CPU ms well above them mean a launch-bound step."""
    from torch.profiler import ProfilerActivity, profile

    fedpriv_run = fedpriv("auto")(build_model(model_name, seed=0).to(device), x, y)
    plain_run = non_private(build_model(model_name, seed=0).to(device), x, y)
    fedpriv_run(2), plain_run(2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with torch.profiler.record_function("nonprivate.step"):
            plain_run(steps)
            _sync(device)
        with torch.profiler.record_function("fedpriv.step"):
            fedpriv_run(steps)
            _sync(device)
    averages = prof.key_averages()
    result = _step_parts(per_step_ms(averages, steps), "ms")
    if device.type == "cuda":  # the CPU times above then include waiting for the GPU at the end
        result |= _step_parts(per_step_gpu_ms(averages, steps), "gpu_ms")
    return result


def _step_parts(totals: dict[str, float], unit: str) -> dict[str, Any]:
    stages = {name.removeprefix("dpsgd."): totals.get(name, 0.0) for name in STAGES}
    stages["other"] = totals["fedpriv.step"] - sum(stages.values())  # set-up, loop, progress bar
    return {f"nonprivate_step_{unit}": round(totals["nonprivate.step"], 3),
            f"fedpriv_step_{unit}": round(totals["fedpriv.step"], 3),
            f"fedpriv_stages_{unit}": {name: round(ms, 3) for name, ms in stages.items()}}


def per_step_ms(averages: Iterable[Any], steps: int) -> dict[str, float]:
    """CPU ms per step of each range in ``prof.key_averages()``.  With CUDA activity a range
    is listed twice, as a CPU row and as a CUDA row with no CPU time: only the CPU row counts."""
    return {e.key: e.cpu_time_total / 1e3 / steps for e in averages if e.device_type == DeviceType.CPU}


def per_step_gpu_ms(averages: Iterable[Any], steps: int) -> dict[str, float]:
    """GPU ms per step of each range: the time of the kernels it launched (its CPU row's device
    time; the CUDA row's is the range's span on the GPU's timeline, idle gaps included)."""
    return {e.key: e.device_time_total / 1e3 / steps for e in averages if e.device_type == DeviceType.CPU}


def _ratios(medians: dict[tuple[str, str], float], model: str) -> dict[str, float | None]:
    ours = medians.get((model, "fedpriv"))
    opacus_rates = [r for (m, i), r in medians.items() if m == model and i.startswith("opacus_")]
    base = medians.get((model, "nonprivate"))
    return {
        "vs_nonprivate": round(ours / base, 3) if ours and base else None,
        "vs_opacus_best": round(ours / max(opacus_rates), 3) if ours and opacus_rates else None,
    }


def print_table(result: dict) -> None:
    print(f"{'model':<6} {'impl':<18} {'samples/s':>10} {'spread':>7}")
    for case in result["cases"]:
        rate = case["samples_per_s"]
        spread = f"{case['spread']:.0%}" if rate is not None else ""
        print(f"{case['model']:<6} {case['impl']:<18} {rate if rate is not None else 'skipped':>10} {spread:>7}")
    print(f"\n{'model':<6} {'vs non-private':>15} {'vs Opacus best':>15}")
    for model, ratio in result["ratios"].items():
        print(f"{model:<6} {ratio['vs_nonprivate']!s:>15} {ratio['vs_opacus_best']!s:>15}")
    print("\nwhere a step's time goes (ms, profiled):")
    for model, parts in result["breakdown"].items():
        stages = ", ".join(f"{k} {v}" for k, v in parts["fedpriv_stages_ms"].items())
        print(f"{model:<6} non-private {parts['nonprivate_step_ms']}; fedpriv {parts['fedpriv_step_ms']}: {stages}")
        if "fedpriv_stages_gpu_ms" in parts:
            stages = ", ".join(f"{k} {v}" for k, v in parts["fedpriv_stages_gpu_ms"].items())
            print(f"{'':<6} GPU kernels: non-private {parts['nonprivate_step_gpu_ms']}; "
                  f"fedpriv {parts['fedpriv_step_gpu_ms']}: {stages}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m benchmarks.dpsgd", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter warm-up, fewer and shorter chunks")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--threads", type=at_least(1), default=os.cpu_count() or 1,
                        help="torch threads (default: all)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall or process CPU time")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{args.threads} torch thread(s), {args.clock} clock, batch {BATCH}")
    result = {"threads": args.threads, "clock": args.clock, **benchmark(args.quick, CLOCKS[args.clock])}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


if __name__ == "__main__":
    main()
