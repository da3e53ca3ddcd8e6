"""Local training: the plan (``plan``), one round of DP-SGD under it (``local``) and plain
evaluation (``evaluation``). The names below are the package's API; those of ``local`` and
``evaluation`` load on first use, so that planning (``plan``: σ, events, the planner) does
not import torch."""

from typing import TYPE_CHECKING

from fedpriv.lazy import lazy_names
from fedpriv.training.plan import (
    LRSchedule,
    OptimizerKind,
    TrainingPlan,
    calibrate_plan,
    cosine_lr,
    default_epochs,
    default_plan,
)

if TYPE_CHECKING:
    from fedpriv.training.evaluation import evaluate
    from fedpriv.training.local import default_device, make_optimizer, round_spend, train_round, with_physical_batch

_TORCH: dict[str, str] = {"evaluate": "evaluation", **dict.fromkeys(
    ("default_device", "make_optimizer", "round_spend", "train_round", "with_physical_batch"), "local")}
__getattr__ = lazy_names(__name__, _TORCH)

__all__ = [
    "LRSchedule", "OptimizerKind", "TrainingPlan", "calibrate_plan", "cosine_lr", "default_device", "default_epochs",
    "default_plan", "evaluate", "make_optimizer", "round_spend", "train_round", "with_physical_batch",
]
