"""Can DP-SGD train this model? Checked on the model itself, before anything is booked.

Like Opacus' ``ModuleValidator``, for models fedpriv has not seen (a user's task):

- a layer known to mix the examples of a batch (BatchNorm; InstanceNorm with running
  statistics) is refused by type (``modules.check_model``), with the fix;
- any other layer that does so is found by a test on two examples: example 1's output
  must not change when example 2 changes (same dropout masks both times). A layer that
  mixes examples makes example 1's gradient depend on example 2, so per-example clipping
  would no longer bound one record's influence;
- the per-example gradient path is chosen per model (``chosen_mode``): book-keeping where
  every layer with parameters has a rule (``bookkeeping.LAYER_RULES``), vmap otherwise.
"""

from __future__ import annotations

import torch
from torch import nn

from fedpriv.dpsgd.bookkeeping import supports_bookkeeping
from fedpriv.dpsgd.config import GradSampleMode
from fedpriv.dpsgd.modules import UnsupportedModuleError, check_model

FIX = "replace it with a per-example layer (GroupNorm or LayerNorm in place of BatchNorm)"
MIXING_TOLERANCE = 1e-5
"""Largest change of example 1's output (relative to its size) still taken as float noise."""


def validate_model(model: nn.Module, first: torch.Tensor, second: torch.Tensor) -> None:
    """Raise ``UnsupportedModuleError`` (one line, with the fix) where ``model`` mixes the
    examples of a batch: by layer type, then by running ``first`` beside ``second`` and
    beside another example (``second`` changed) and comparing ``first``'s outputs. The
    model's mode and the caller's random state are left as they were."""
    check_model(model)
    other = _changed(first, second)
    was_training = model.training
    model.train()  # the mode DP-SGD trains in: BatchNorm-like layers mix only here
    try:
        with torch.no_grad():
            a = _first_output(model, first, second)
            b = _first_output(model, first, other)
    finally:
        model.train(was_training)
    scale = max(1.0, float(a.abs().max()))
    if a.shape != b.shape or float((a - b).abs().max()) > MIXING_TOLERANCE * scale:
        raise UnsupportedModuleError(
            f"{type(model).__name__} mixes the examples of a batch (example 1's output changed when example 2 "
            f"changed), so per-example clipping would not bound one record's influence: find the layer that "
            f"computes across the batch dimension and {FIX}")


def chosen_mode(model: nn.Module) -> GradSampleMode:
    """The per-example gradient path ``train_dpsgd`` takes for ``model`` (``AUTO``):
    book-keeping where every layer with parameters is supported, vmap otherwise."""
    return GradSampleMode.BOOKKEEPING if supports_bookkeeping(model) else GradSampleMode.VMAP


def _first_output(model: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Example 1's output in a batch of (first, second), with dropout masks fixed by a seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        output = model(torch.stack([first, second]))
    if not isinstance(output, torch.Tensor) or output.dim() == 0 or len(output) != 2:
        raise UnsupportedModuleError(
            f"{type(model).__name__} must return one tensor with one row per example (batch first); got "
            f"{type(output).__name__}{tuple(output.shape) if isinstance(output, torch.Tensor) else ''} "
            "for a batch of 2")
    return output[0].detach().double()


def _changed(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """An example other than ``second``: for integer inputs (tokens, indices), ``first``, or
    each of ``second``'s values moved to the next one up to its largest (never a value out
    of the range it spans: an index stays valid); else ``second`` plus unit noise."""
    if first.is_floating_point() or first.is_complex():
        generator = torch.Generator().manual_seed(1)
        return second + torch.randn(second.shape, generator=generator, dtype=second.dtype).to(second.device)
    if not torch.equal(first, second):
        return first
    top = int(second.max()) if second.numel() else 0
    return (second + 1) % (top + 1) if top > 0 else second
