"""Local training: the plan (``plan``), one round of DP-SGD under it (``local``) and plain
evaluation (``evaluation``). The names below are the package's API."""

from fedpriv.training.evaluation import evaluate
from fedpriv.training.local import default_device, make_optimizer, round_spend, train_round, with_physical_batch
from fedpriv.training.plan import (
    LRSchedule,
    OptimizerKind,
    TrainingPlan,
    calibrate_plan,
    cosine_lr,
    default_epochs,
    default_plan,
)

__all__ = [
    "LRSchedule", "OptimizerKind", "TrainingPlan", "calibrate_plan", "cosine_lr", "default_device", "default_epochs",
    "default_plan", "evaluate", "make_optimizer", "round_spend", "train_round", "with_physical_batch",
]
