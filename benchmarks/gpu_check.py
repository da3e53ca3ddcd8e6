"""What a lent CUDA device says about the DP-SGD engine: ``python -m benchmarks.gpu_check STEP --out FILE``.

Steps (``benchmarks/gpu_check.sh`` runs them, time-boxed, with the suite's CUDA tests,
``benchmarks.dpsgd`` and one MNIST point; results in docs/gpu.md):

- ``env``: the card, driver, torch/CUDA/cuDNN versions and the float32 precision flags.
- ``engine``: the clipped sum of a micro-batch on CUDA and on the CPU, in both gradient
  modes and both clippings, for every zoo model, against an independent float64 reference
  (one ``autograd.grad`` per example, clipped by hand) and beside the device's ordinary
  batched gradient's own error; each example's contribution on CUDA
  (a micro-batch of one) within C; the events ``train_dpsgd`` reports on both devices;
  the CUDA noise's and Poisson lots' moments.
- ``memory``: ``fedpriv.dpsgd.memory``'s step estimate against the CUDA allocator's peak, the
  physical batch chosen from the real free memory (and one real step at it), and the Ray
  GPU share of ``simulations._gpu`` with the batch a client then chooses within it.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.data import IMAGE_SHAPES
from fedpriv.dpsgd import Clipping, DPSGDConfig, GradSampleMode, train_dpsgd
from fedpriv.dpsgd.clipping import per_layer_bound
from fedpriv.dpsgd.engine import clipped_sum_function, gradient_buffers
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.noise import fill_gaussian_noise_
from fedpriv.dpsgd.sampling import poisson_lot
from fedpriv.models import build_model, input_shape

DATASET_OF = {"mlp": "mnist", "cnn": "mnist", "scatter_linear": "mnist", "scatter_cnn": "mnist",
              "cifar_cnn": "cifar10"}
BATCH = 16
"""Examples in each compared micro-batch: small, so the float64 per-example reference is quick."""
AGREE = 1e-4
"""Relative L2 distance within which a clipped sum counts as the reference's (float32 sums of
16 examples differ by ~1e-6; TF32 convolutions by ~1e-3, reported beside), or twice the
device's own ordinary gradient's distance where that is larger."""
GIB = 1 << 30
DEVICE = torch.device(os.environ.get("GPU_CHECK_DEVICE", "cuda"))
"""The device checked against the CPU (``GPU_CHECK_DEVICE=cpu``: a dry run of ``engine`` here)."""


def environment() -> dict[str, Any]:
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False).stdout
    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    versions = {}
    for package in ("flwr", "dp-accounting", "opacus", "kymatio", "numpy", "scipy"):
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception as err:  # noqa: BLE001 - a missing package is a finding, not a failure
            versions[package] = f"missing: {err}"
    return {
        "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "cuda_available": cuda,
        "device": props.name if props else None,
        "total_memory_gib": round(props.total_memory / GIB, 2) if props else None,
        "multiprocessors": props.multi_processor_count if props else None,
        "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
        "packages": versions, "cpu_count": os.cpu_count(), "nvidia_smi": smi,
    }


def _inputs(name: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = input_shape(name, IMAGE_SHAPES[DATASET_OF[name]])
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


def reference_per_example(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Each example's gradient, per parameter tensor, in float64: one ``autograd.grad`` each."""
    exact = copy.deepcopy(model).double()
    params = list(trainable_parameters(exact).values())
    return [[g.reshape(-1) for g in torch.autograd.grad(F.cross_entropy(exact(x[i : i + 1].double()), y[i : i + 1]),
                                                          params)]
            for i in range(len(x))]


def reference_clipped_sum(grads: list[list[torch.Tensor]], max_grad_norm: float, clipping: Clipping) -> torch.Tensor:
    """Σ_i clip(g_i) by the definition: flat to C, or per tensor to C/√K."""
    total = torch.zeros(sum(g.numel() for g in grads[0]), dtype=torch.float64)
    for per_tensor in grads:
        if clipping is Clipping.FLAT:
            norm = torch.cat(per_tensor).norm()
            total += torch.cat(per_tensor) * min(1.0, max_grad_norm / float(norm))
        else:
            bound = per_layer_bound(max_grad_norm, len(per_tensor))
            total += torch.cat([g * min(1.0, bound / float(g.norm())) for g in per_tensor])
    return total


def engine_clipped_sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: DPSGDConfig,
                        ) -> tuple[torch.Tensor, float, list[float]]:
    """The engine's clipped sum of the micro-batch (flat), its loss sum, and each example's
    own contribution's norm (the clipped sum of a micro-batch of one)."""
    params = trainable_parameters(model)
    flat, grads = gradient_buffers(params)
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        flat.zero_()
        loss = float(clipped_sum(x, y, grads))
        total = flat.detach().double().cpu().clone()
        norms = []
        for i in range(len(x)):
            flat.zero_()
            clipped_sum(x[i : i + 1], y[i : i + 1], grads)
            norms.append(float(flat.double().norm()))
    return total, loss, norms


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def plain_gradient_error(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Relative error of the ordinary batched gradient on ``DEVICE`` against float64 on the CPU:
    the precision of the device's own kernels, which no clipped sum can beat."""
    exact, on_device = copy.deepcopy(model).double(), copy.deepcopy(model).to(DEVICE)

    def gradient(m: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(F.cross_entropy(m(inputs), labels), list(trainable_parameters(m).values()))
        return torch.cat([g.reshape(-1) for g in grads]).double().cpu()

    return _relative(gradient(on_device, x.to(DEVICE), y.to(DEVICE)), gradient(exact, x.double(), y))


@functools.cache
def _case_data(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """Model ``name``, a micro-batch for it and the reference per-example gradients (shared by its cases)."""
    model = build_model(name, seed=0)
    x, y = _inputs(name, BATCH, seed=1)
    return model, x, y, reference_per_example(model, x, y)


def engine_case(name: str, mode: GradSampleMode, clipping: Clipping) -> dict[str, Any]:
    model, x, y, per_example = _case_data(name)
    norms = sorted(float(torch.cat(g).norm()) for g in per_example)
    c = norms[len(norms) // 2]  # about half the examples are clipped
    config = DPSGDConfig(1.0, c, sample_rate=0.5, max_physical_batch_size=BATCH, clipping=clipping,
                         grad_sample_mode=mode)
    reference = reference_clipped_sum(per_example, c, clipping)
    cpu_sum, cpu_loss, _ = engine_clipped_sums(model, x, y, config)
    gpu_model = copy.deepcopy(model).to(DEVICE)
    result: dict[str, Any] = {"model": name, "mode": str(mode), "clipping": str(clipping), "max_grad_norm": c}
    for label, tf32 in (("cuda", None), ("cuda_no_tf32", False)):
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        try:
            gpu_sum, gpu_loss, gpu_norms = engine_clipped_sums(gpu_model, x.to(DEVICE), y.to(DEVICE), config)
            plain = plain_gradient_error(model, x, y)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        result[label] = {
            "vs_cpu": _relative(gpu_sum, cpu_sum), "vs_reference": _relative(gpu_sum, reference),
            "loss_vs_cpu": abs(gpu_loss - cpu_loss) / abs(cpu_loss),
            "max_contribution_over_c": max(gpu_norms) / c, "plain_gradient_vs_reference": plain,
        }
    result["cpu_vs_reference"] = _relative(cpu_sum, reference)
    # the same sum, up to the device's own precision (cifar_cnn's batched CUDA gradient is off by ~1e-3)
    no_tf32 = result["cuda_no_tf32"]
    result["agree"] = result["cpu_vs_reference"] < AGREE and no_tf32["vs_reference"] < max(
        AGREE, 2 * no_tf32["plain_gradient_vs_reference"])
    result["within_c"] = all(result[k]["max_contribution_over_c"] <= 1 + 1e-5 for k in ("cuda", "cuda_no_tf32"))
    return result


def events_case(name: str, secure: bool = False) -> dict[str, Any]:
    """The report of 3 steps of ``train_dpsgd`` on CPU and on CUDA: the same events."""
    reports = {}
    for device in ("cpu", DEVICE):
        model = build_model(name, seed=0).to(device)
        x, y = (t.to(device) for t in _inputs(name, 64, seed=2))
        config = DPSGDConfig(1.1, 1.0, sample_rate=0.25, max_physical_batch_size=8, secure_mode=secure)
        gens = (None, None) if secure else tuple(torch.Generator(device).manual_seed(s) for s in (3, 4))
        report = train_dpsgd(model, x, y, config=config, steps=3, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             sampling_generator=gens[0], noise_generator=gens[1])
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        reports[device] = (report, finite)
    (cpu, cpu_finite), (gpu, gpu_finite) = reports["cpu"], reports[DEVICE]
    return {"model": name, "secure_mode": secure, "events": [repr(e) for e in gpu.events],
            "same_events": cpu.events == gpu.events, "same_steps": cpu.steps == gpu.steps,
            "same_num_examples": cpu.num_examples == gpu.num_examples,
            "finite_parameters": cpu_finite and gpu_finite, "mean_loss": {"cpu": cpu.mean_loss, "cuda": gpu.mean_loss}}


def randomness() -> dict[str, Any]:
    """Moments of the CUDA noise (seeded and secure) and of CUDA Poisson lots' sizes, as z-scores."""
    out: dict[str, Any] = {}
    for label, size, secure in (("noise", 1 << 24, False), ("secure_noise", 1 << 18, True)):
        std = 2.5
        flat = torch.empty(size, device=DEVICE)
        fill_gaussian_noise_(flat, std, None if secure else torch.Generator(DEVICE).manual_seed(0), secure)
        flat = flat.double()
        sample_std = float(flat.std())
        out[label] = {"draws": size, "mean_z": float(flat.mean()) / (std / math.sqrt(size)),
                      "std_z": (sample_std - std) / (std / math.sqrt(2 * size))}
    n, q, lots = 100_000, 0.01, 200
    gen = torch.Generator(DEVICE).manual_seed(0)
    sizes = torch.tensor([poisson_lot(n, q, gen).numel() for _ in range(lots)], dtype=torch.float64)
    out["lot_size"] = {"expected": n * q, "mean": float(sizes.mean()),
                       "mean_z": (float(sizes.mean()) - n * q) / math.sqrt(n * q * (1 - q) / lots)}
    return out


def engine() -> dict[str, Any]:
    cases = [engine_case(name, mode, clipping) for name in DATASET_OF
             for mode in (GradSampleMode.BOOKKEEPING, GradSampleMode.VMAP)
             for clipping in (Clipping.FLAT, Clipping.PER_LAYER)]
    events = [events_case(name) for name in ("mlp", "cnn", "scatter_linear")] + [events_case("mlp", secure=True)]
    return {"batch": BATCH, "agree_tolerance": AGREE, "clipped_sums": cases, "events": events,
            "randomness": randomness(),
            "all_agree": all(c["agree"] for c in cases), "all_within_c": all(c["within_c"] for c in cases),
            "all_same_events": all(e["same_events"] and e["finite_parameters"] for e in events)}


def real_step_peak(model: nn.Module, shape: tuple[int, ...], config: DPSGDConfig, batch: int) -> int:
    """Bytes the CUDA allocator's peak rose by during one ``train_dpsgd`` step on ``batch``
    resident examples (after one warm-up step on a copy, so cuBLAS/cuDNN workspaces exist)."""
    x = torch.randn(batch, *shape, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    config = DPSGDConfig(1.0, 1.0, sample_rate=1.0, max_physical_batch_size=batch,
                         grad_sample_mode=config.grad_sample_mode)

    def step(m: nn.Module) -> None:
        gens = [torch.Generator("cuda").manual_seed(s) for s in (0, 1)]
        train_dpsgd(m, x, y, config=config, steps=1, optimizer=torch.optim.SGD(m.parameters(), lr=0.0, momentum=0.9),
                    sampling_generator=gens[0], noise_generator=gens[1])

    step(copy.deepcopy(model))
    fresh = copy.deepcopy(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(fresh)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def memory() -> dict[str, Any]:
    from fedpriv.dpsgd.memory import GPU_SHARE_ENV, device_budget, fit_batch, measure_step_memory

    total = torch.cuda.get_device_properties(0).total_memory
    estimates = []
    for name, mode in (("mlp", "vmap"), ("mlp", "bookkeeping"), ("cnn", "bookkeeping"), ("cnn", "vmap"),
                       ("scatter_linear", "bookkeeping"), ("cifar_cnn", "bookkeeping")):
        model = build_model(name, seed=0).cuda()
        shape = input_shape(name, IMAGE_SHAPES[DATASET_OF[name]])
        config = DPSGDConfig(1.0, 1.0, sample_rate=0.01, grad_sample_mode=GradSampleMode(mode))
        started = time.perf_counter()
        step = measure_step_memory(model, shape, config)
        measure_s = time.perf_counter() - started
        row: dict[str, Any] = {"model": name, "mode": mode, "measure_s": round(measure_s, 3),
                               "per_example_mib": step.per_example_bytes / 2**20, "at": {}}
        for batch in (128, 512):
            estimate, peak = step.bytes_at(batch), real_step_peak(model, shape, config, batch)
            row["at"][batch] = {"estimated_mib": estimate / 2**20, "cuda_peak_mib": peak / 2**20,
                                "ratio": estimate / peak if peak else None}
        budget = device_budget("cuda")
        row["budget_gib"] = budget / GIB
        row["chosen_batch"] = chosen = fit_batch(step, budget, max_batch=60_000)
        if name == "mlp" and mode == "vmap":  # the largest step: does the chosen batch run?
            try:
                row["at"][chosen] = {"estimated_mib": step.bytes_at(chosen) / 2**20,
                                     "cuda_peak_mib": real_step_peak(model, shape, config, chosen) / 2**20}
                row["chosen_batch_ran"] = True
            except torch.cuda.OutOfMemoryError as err:
                row["chosen_batch_ran"] = f"out of memory: {str(err)[:200]}"
        estimates.append(row)
        del model
        torch.cuda.empty_cache()
    from fedpriv.federation.settings import RunSettings  # imports flwr: after the estimates
    from simulations._gpu import client_gpu_fraction, likely_largest_lot

    shares = []
    for run_config, clients in (({}, 10), ({}, 100), ({"model": "mlp", "lot-size": 256}, 10),
                                ({"dataset": "cifar10"}, 10), ({"dataset": "cifar10", "lot-size": 1024}, 10)):
        settings = RunSettings.from_run_config(run_config)
        share = client_gpu_fraction(settings, clients, total)
        shares.append({"run_config": run_config, "clients": clients, "num_gpus": share,
                       "clients_per_gpu": math.floor(1 / share + 1e-9)})
    # a client given the MNIST default's share chooses its batch within it: at least its likely lot
    settings = RunSettings.from_run_config({})
    share = client_gpu_fraction(settings, 10, total)
    held = 6_000
    model = build_model("scatter_linear", seed=0).cuda()
    shape = input_shape("scatter_linear", IMAGE_SHAPES["mnist"])
    data = torch.zeros(held, *shape, device="cuda")
    os.environ[GPU_SHARE_ENV] = str(share)
    try:
        budget = device_budget("cuda")
    finally:
        del os.environ[GPU_SHARE_ENV]
    step = measure_step_memory(model, shape, DPSGDConfig(1.0, 1.0, sample_rate=0.01))
    lot = likely_largest_lot(4096 * held / 60_000)
    within = {"num_gpus": share, "budget_mib": budget / 2**20, "likely_largest_lot": lot,
              "batch_within_share": fit_batch(step, budget), "resident_mib": data.numel() * 4 / 2**20}
    within["fits"] = within["batch_within_share"] >= lot
    return {"total_memory_gib": total / GIB, "estimates": estimates, "ray_shares": shares,
            "client_within_share": within}


STEPS: dict[str, Callable[[], dict[str, Any]]] = {"env": environment, "engine": engine, "memory": memory}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.step != "env" and DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check runs on a GPU machine only")
    started = time.perf_counter()
    result = {"step": args.step, **STEPS[args.step](), "seconds": round(time.perf_counter() - started, 2)}
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.startswith("all_") or k in ("device", "torch", "seconds")}))


if __name__ == "__main__":
    main()
