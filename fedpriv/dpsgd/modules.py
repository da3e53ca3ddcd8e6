"""Which models DP-SGD can train: per-example gradients need examples that do not interact.

A layer that mixes the examples of a batch (BatchNorm's batch statistics, SyncBatchNorm,
InstanceNorm with running stats) makes one example's gradient depend on the others, so
clipping no longer bounds its influence; running statistics (InstanceNorm with
``track_running_stats``) would also release data unprivatised with the model.  Such models
are refused before any step.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH_MIXING_LAYERS: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm,)


class UnsupportedModuleError(TypeError):
    """The model holds a layer that DP-SGD cannot train privately."""


def check_model(model: nn.Module) -> None:
    """Raise ``UnsupportedModuleError`` naming every layer that mixes examples."""
    offending = [
        f"{name or '<root>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if _mixes_examples(module)
    ]
    if offending:
        raise UnsupportedModuleError(
            "DP-SGD needs per-example gradients, but these layers mix the examples of a batch: "
            + ", ".join(offending)
            + ". Replace BatchNorm with GroupNorm (e.g. nn.GroupNorm(min(32, channels), channels)) "
            "or LayerNorm; InstanceNorm needs track_running_stats=False."
        )


def _mixes_examples(module: nn.Module) -> bool:
    if isinstance(module, BATCH_MIXING_LAYERS):
        return True
    return isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters DP-SGD privatises, by name, in ``named_parameters`` order."""
    params: dict[str, torch.Tensor] = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise UnsupportedModuleError("the model has no trainable parameters")
    return params


def model_device(params: dict[str, torch.Tensor]) -> torch.device:
    """The single device holding all ``params``."""
    devices = {p.device for p in params.values()}
    if len(devices) != 1:
        spread = sorted(map(str, devices))
        raise UnsupportedModuleError(f"the model's parameters are spread over devices {spread}")
    return devices.pop()
