"""Each simulated client's share of a GPU, from the measured memory of its DP-SGD step.

Ray's ``num_gpus`` is a scheduling share, not a memory limit: a client with 0.25 shares the
GPU with up to three others.  The share is derived here from what one client holds there —
its CUDA context, model and training data — and its step at the physical batch it will
use (the run's ``max-physical-batch``, else the largest lot it is likely to draw), measured
on the CPU with ``fedpriv.dpsgd.memory`` (tensor sizes do not depend on the device).  Each
client then gets the share as ``$FEDPRIV_GPU_SHARE`` and chooses its physical batch within it.
"""

from __future__ import annotations

import math

import torch

from fedpriv.data import IMAGE_SHAPES, TRAIN_SIZES
from fedpriv.dpsgd.memory import example_bytes, gpu_fraction, measure_step_memory
from fedpriv.federation.settings import Partition, RunSettings
from fedpriv.models import build_model, input_shape
from fedpriv.training import make_optimizer
from server.assign import base_plan

LOT_STDS = 4
"""A Poisson lot of mean L exceeds L + 4√L with probability below 1e-4 (a larger one is
split into two micro-batches, which is still correct)."""


def likely_largest_lot(expected: float) -> int:
    """L + ``LOT_STDS``·√L: the largest lot of expected size L worth one micro-batch."""
    return math.ceil(expected + LOT_STDS * math.sqrt(expected))


def client_gpu_fraction(settings: RunSettings, num_clients: int, total_bytes: int) -> float:
    """``num_gpus`` for each of ``num_clients`` clients on GPUs of ``total_bytes``."""
    plan = base_plan(settings)
    dataset = settings.dataset
    shape = input_shape(plan.model, IMAGE_SHAPES[dataset])
    train_size = min(settings.limit_train or TRAIN_SIZES[dataset], TRAIN_SIZES[dataset])
    # IID parts are equal; a skewed part may hold up to the whole training set
    held = math.ceil(train_size / num_clients) if settings.partition is Partition.IID else train_size
    model = build_model(plan.model, settings.seed)
    memory = measure_step_memory(model, shape, plan.dpsgd_config(held, physical_batch=1),
                                 optimizer=lambda m: make_optimizer(m, plan, 1))
    # without a lot-size, the server shares the plan's lot out in proportion to the data
    expected_lot = plan.lot_size if settings.lot_size else plan.lot_size * held / train_size
    batch = min(plan.max_physical_batch_size or likely_largest_lot(expected_lot), held)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    data_bytes = held * example_bytes(shape, torch.float32)
    return gpu_fraction(memory.bytes_at(batch), model_bytes + data_bytes, total_bytes)
