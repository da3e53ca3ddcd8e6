"""How much memory one DP-SGD step takes, measured, and the physical batch that fits.

The Poisson lot is the unit of privacy; the physical batch only splits a lot into
micro-batches of at most that many examples, so it changes memory and speed, never the
privacy event (nor the clipped sum, beyond float rounding).

**Measured, not modelled.** ``measure_step_memory`` runs one real ``train_dpsgd`` step
(noise, clipped sums in the config's gradient mode, optimizer step) on a copy of the model,
twice: on micro-batches of ``PROBE_BATCHES`` = (2, 4) random examples, under a
``TorchDispatchMode`` that counts the bytes of every tensor storage an op creates and
releases them when the storage dies.  Both runs execute the same ops, so each point t of the
step is a line, live_t(B) = a_t + B·s_t; the peak at any B is the largest of those lines (an
upper envelope).  A hand formula would have to know every layer rule and every temporary of
the engine (and be rewritten with it); per-point lines also see a per-example peak that a
batch-independent phase hides at small B (the optimizer's or the noise's temporaries).  The
counter works on any device; it does not see memory an op allocates and frees internally
(CPU convolution scratch, cuDNN workspaces) nor allocator rounding: the budgets keep a safety
margin for that (``SAFETY``).  Checked against the CPU allocator's own count
(``torch.profiler``) in ``tests/dpsgd/test_memory.py``.

The estimate covers what a step allocates beyond the resident model and data set: the
gradient buffer, optimizer state, noise, the gathered micro-batch (``sample bytes``, added to
every line: conservative), activations and per-example gradients.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from fedpriv.dpsgd.config import DPSGDConfig
from fedpriv.dpsgd.engine import train_dpsgd
from fedpriv.dpsgd.modules import model_device, trainable_parameters
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.environment import number_from_env

PROBE_BATCHES = (2, 4)
"""Micro-batch sizes of the two measured steps (1 is avoided: some ops special-case it)."""
SAFETY = 0.8
"""Fraction of the free memory a step may plan to use: the rest covers what the counter
cannot see (kernel scratch, cuDNN workspaces, allocator rounding) and fragmentation."""
CPU_STEP_BYTES = 1 << 30
"""On CPU a step's transient memory is kept under 1 GiB: memory is rarely the limit there,
and beyond that bigger micro-batches only cost page faults, not speed."""
CUDA_CONTEXT_BYTES = 512 << 20
"""GPU memory a process's CUDA context takes outside torch's allocator (typically
300–600 MiB): each Ray client is its own process and pays it."""
GPU_SHARE_ENV = "FEDPRIV_GPU_SHARE"
"""Fraction of the GPU's memory this process may use (e.g. its Ray ``num_gpus``); unset: 1."""
GPU_FRACTION_GRID = 0.05
"""Ray GPU fractions are rounded up to multiples of this (at most 20 clients per GPU)."""
BATCH_GRID = 64
"""An automatic physical batch of 64 or more is rounded down to a multiple of this, so a
slightly different free memory rarely changes it (and with it the float rounding)."""

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


class MemoryBudgetError(ValueError):
    """Not even one example fits the memory budget."""


@dataclass(frozen=True)
class StepMemory:
    """Bytes one DP-SGD step allocates as a function of the micro-batch size B:
    ``max(a + B·s for a, s in lines)`` (only the lines that are on top for some B ≥ 1)."""

    lines: tuple[tuple[float, float], ...]

    def bytes_at(self, batch: int) -> int:
        return math.ceil(max(a + batch * s for a, s in self.lines))

    @property
    def per_example_bytes(self) -> float:
        """The steepest line's slope: what each further example adds at large B."""
        return max(s for _, s in self.lines)

    def largest_batch(self, budget_bytes: float) -> float:
        """The largest B ≥ 0 whose step fits ``budget_bytes`` (``inf`` when no line grows)."""
        largest = math.inf
        for a, s in self.lines:
            if s > 0:
                largest = min(largest, math.floor((budget_bytes - a) / s))
            elif a > budget_bytes:
                return 0
        return max(0, largest)


def measure_step_memory(
    model: nn.Module,
    sample_shape: Sequence[int],
    config: DPSGDConfig,
    *,
    optimizer: OptimizerFactory | None = None,
    loss_fn: LossFn = F.cross_entropy,
    dtype: torch.dtype | None = None,
) -> StepMemory:
    """The memory of one ``train_dpsgd`` step of ``model`` (on its device, left untouched)
    on examples of ``sample_shape`` and ``dtype`` (default: the parameters'), with
    ``config``'s gradient mode, clipping, noise and secure mode (σ, C, q and the physical
    batch do not matter).  ``optimizer(model)`` builds the training's optimizer (default
    SGD with momentum), whose state is part of the step."""
    params = trainable_parameters(model)
    device = model_device(params)
    dtype = dtype or next(iter(params.values())).dtype
    sample_bytes = example_bytes(sample_shape, dtype)
    timelines = [
        _timeline(model, sample_shape, dtype, device, config, batch, optimizer, loss_fn) for batch in PROBE_BATCHES
    ]
    (b1, b2), (t1, t2) = PROBE_BATCHES, timelines
    if len(t1) != len(t2):  # the ops depend on B: one line through the two peaks
        t1, t2 = [max(t1)], [max(t2)]
    slopes = [(y2 - y1) / (b2 - b1) for y1, y2 in zip(t1, t2, strict=True)]
    lines = [(y1 - b1 * s, s + sample_bytes) for y1, s in zip(t1, slopes, strict=True)]
    return StepMemory(_upper_envelope(lines))


def example_bytes(sample_shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes one training example holds: its features of ``sample_shape`` and ``dtype``, and an int64 label."""
    return math.prod(sample_shape) * dtype.itemsize + torch.int64.itemsize


def fit_batch(memory: StepMemory, budget_bytes: float, max_batch: int | None = None) -> int:
    """The physical batch: the largest that fits ``budget_bytes`` (≥ 64: rounded down to a
    multiple of ``BATCH_GRID``), at most ``max_batch`` (no lot exceeds the data set);
    ``MemoryBudgetError`` when not even one example fits."""
    largest = memory.largest_batch(budget_bytes)
    if largest < 1:
        raise MemoryBudgetError(
            f"one DP-SGD step on a single example needs about {_mib(memory.bytes_at(1))} MiB "
            f"but the memory budget is {_mib(budget_bytes)} MiB: free memory, use a smaller model, "
            "or set the physical batch by hand (max_physical_batch_size, --max-physical-batch)"
        )
    if largest >= BATCH_GRID and math.isfinite(largest):
        largest = largest // BATCH_GRID * BATCH_GRID
    if max_batch is not None:
        largest = min(largest, max_batch)
    if math.isinf(largest):
        raise ValueError("the step's memory does not grow with the batch: give max_batch")
    return int(largest)


def choose_physical_batch(
    model: nn.Module,
    sample_shape: Sequence[int],
    budget_bytes: float,
    config: DPSGDConfig,
    *,
    max_batch: int | None = None,
    optimizer: OptimizerFactory | None = None,
    loss_fn: LossFn = F.cross_entropy,
) -> int:
    """The largest physical batch whose measured step fits ``budget_bytes`` (see
    ``fit_batch``); ``device_budget(device)`` is the usual budget."""
    memory = measure_step_memory(model, sample_shape, config, optimizer=optimizer, loss_fn=loss_fn)
    return fit_batch(memory, budget_bytes, max_batch)


def device_budget(device: torch.device | str) -> int:
    """Bytes a step may allocate on ``device`` now: on CUDA ``cuda_budget`` of the device's
    free memory and this process's share (``$FEDPRIV_GPU_SHARE``); on CPU ``cpu_budget``."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return cuda_budget(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device),
                           gpu_share())
    if "SC_AVPHYS_PAGES" not in getattr(os, "sysconf_names", {}):  # not Linux: free RAM unknown
        return cpu_budget(None)
    return cpu_budget(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def cpu_budget(available_bytes: int | None) -> int:
    """``SAFETY`` × the available RAM (unknown: ignored), at most ``CPU_STEP_BYTES``."""
    if available_bytes is None:
        return CPU_STEP_BYTES
    return min(CPU_STEP_BYTES, int(SAFETY * available_bytes))


def cuda_budget(free: int, total: int, reserved: int, allocated: int, share: float = 1.0) -> int:
    """``SAFETY`` × what this process may still allocate on a GPU: the device's free memory
    plus what its own cache holds unused (reserved − allocated), and no more than its
    ``share`` of the total less its CUDA context and what it already holds."""
    own_limit = share * total - CUDA_CONTEXT_BYTES - allocated
    return max(0, int(SAFETY * min(free + reserved - allocated, own_limit)))


def gpu_share() -> float:
    """``$FEDPRIV_GPU_SHARE`` as a fraction in (0, 1]; 1 when unset."""
    return number_from_env(GPU_SHARE_ENV, 1.0, lambda share: 0 < share <= 1, "a fraction in (0, 1]")


def gpu_fraction(step_bytes: int, resident_bytes: int, total_bytes: int) -> float:
    """The share of a GPU of ``total_bytes`` that one client needs: its CUDA context, its
    resident model and data, and a step of ``step_bytes`` within ``cuda_budget``'s safety
    margin; rounded up to ``GPU_FRACTION_GRID``, at most 1.  Given as ``$FEDPRIV_GPU_SHARE``
    to that client, ``cuda_budget`` then leaves it at least ``step_bytes``."""
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be > 0, got {total_bytes}")
    needed = (CUDA_CONTEXT_BYTES + resident_bytes + step_bytes / SAFETY) / total_bytes
    return min(1.0, math.ceil(needed / GPU_FRACTION_GRID - 1e-9) * GPU_FRACTION_GRID)


def probe_config(config: DPSGDConfig) -> DPSGDConfig:
    """The parts of ``config`` a step's memory depends on (gradient mode, clipping, noise or
    not, secure mode), with σ, C and q normalised: equal probe configs, equal memory."""
    private = config.noise_multiplier > 0
    return dataclasses.replace(
        config, noise_multiplier=float(private), max_grad_norm=1.0 if private else config.max_grad_norm,
        sample_rate=1.0, max_physical_batch_size=1,
    )


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the tensor storages ops create, until each dies; ``timeline``
    holds the count after every op.  A storage an op takes as input before any op created
    it (parameters, data) is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.timeline: list[int] = []
        self._seen: Any = WeakIdKeyDictionary()

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for tensor in _tensors((args, kwargs)):
            self._seen.setdefault(tensor.untyped_storage(), 0)
        out = func(*args, **(kwargs or {}))
        for tensor in _tensors(out):
            storage = tensor.untyped_storage()
            if storage not in self._seen:
                self._seen[storage] = nbytes = storage.nbytes()
                self.live += nbytes
                weakref.finalize(storage, self._release, nbytes)
        self.timeline.append(self.live)
        return out


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _timeline(
    model: nn.Module,
    sample_shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    config: DPSGDConfig,
    batch: int,
    optimizer: OptimizerFactory | None,
    loss_fn: LossFn,
) -> list[int]:
    """Live bytes after each op of one step on ``batch`` random examples (a model copy)."""
    probe = dataclasses.replace(probe_config(config), max_physical_batch_size=batch)
    seeded = torch.Generator(device).manual_seed(0)  # the caller's global RNG is left alone
    features = torch.randn(batch, *sample_shape, dtype=dtype, device=device, generator=seeded) \
        if dtype.is_floating_point else torch.zeros(batch, *sample_shape, dtype=dtype, device=device)  # token ids
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    copied = copy.deepcopy(model)
    opt = optimizer(copied) if optimizer else torch.optim.SGD(copied.parameters(), lr=0.0, momentum=0.9)
    def generator() -> torch.Generator | None:
        return None if probe.secure_mode else torch.Generator(device).manual_seed(0)

    with _LiveBytes() as counter:
        train_dpsgd(copied, features, labels, config=probe, steps=1, optimizer=opt, loss_fn=loss_fn,
                    sampling_generator=generator(), noise_generator=generator(),
                    static_shapes=False)  # the eager step: a capture would count its warm-up too
    return counter.timeline


def _upper_envelope(lines: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The lines not below another at every B ≥ 1: by slope, steepest first, each kept only
    if it is higher at B = 1 than every steeper one."""
    kept: list[tuple[float, float]] = []
    highest = -math.inf
    for a, s in sorted(set(lines), key=lambda line: (-line[1], -line[0])):
        if a + s > highest:
            kept.append((a, s))
            highest = a + s
    return tuple(kept)


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"
