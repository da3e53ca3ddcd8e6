"""What the server checks in every reply before it aggregates: replies are untrusted input.

A TRAIN reply is aggregated only if it holds exactly the records the protocol names, its
privacy record names the entry and events the server booked for that client, its arrays
match the global model's names, shapes and dtypes, every value is finite, and the update
‖θ_client − θ_global‖ is no larger than the plan allows (``update_norm_bound``). Which
message it answers (no duplicates, no stale rounds) and its weight (the server's own,
never a reported number) are the strategy's to check.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import ArrayRecord, Message

from fedpriv.federation import protocol
from fedpriv.privacy.charge import Charge
from fedpriv.training import OptimizerKind, TrainingPlan

NOISE_NORM_SLACK = 10.0
"""‖z‖ ≤ √d + 10 for z ~ N(0, I_d) fails with probability below e^{-50} (Gaussian
concentration of the norm, a 1-Lipschitz function)."""

ADAM_STEP_BOUND = 10.0
"""Adam moves each coordinate by at most about lr·(1−β1)/√(1−β2) ≈ 3.2 lr per step at the
default betas; 10 leaves room."""

ArraySpec = dict[str, tuple[tuple[int, ...], str]]


def array_spec(arrays: ArrayRecord) -> ArraySpec:
    """Names, shapes and dtypes of ``arrays``."""
    return {name: (tuple(array.shape), str(array.dtype)) for name, array in arrays.items()}


def update_norm_bound(plan: TrainingPlan, num_examples: int, num_params: int) -> float:
    """An upper bound, failing with negligible probability, on how far one round of
    ``plan`` can move the model in L2 (∞ for the non-private schedule).

    Per step the privatised gradient is (Σ clip(g_i) + σC·z) / (q·ñ): at most C per
    example of the lot plus the noise's norm. The true N behind a released ñ is unknown,
    so the lot is bounded generously from N ≤ 2ñ + 1000: |lot| ≤ qN + 10√(qN) + 10. SGD
    with momentum μ moves at most lr·‖g‖/(1−μ) per step; Adam at most ``ADAM_STEP_BOUND``·lr
    per coordinate.
    """
    steps = plan.steps_per_round(num_examples)
    if plan.optimizer is OptimizerKind.ADAM:
        return steps * plan.lr * ADAM_STEP_BOUND * math.sqrt(num_params)
    if math.isinf(plan.max_grad_norm):
        return math.inf
    q = plan.sample_rate(num_examples)
    expected = q * (2 * num_examples + 1000)
    lot = expected + 10 * math.sqrt(expected) + 10
    noise = plan.noise_multiplier * plan.max_grad_norm * (math.sqrt(num_params) + NOISE_NORM_SLACK)
    gradient = (plan.max_grad_norm * lot + noise) / (q * num_examples)
    return steps * plan.lr * gradient / (1 - plan.momentum)


def check_train_reply(reply: Message, charge: Charge, global_arrays: ArrayRecord, max_norm: float) -> str | None:
    """Why a TRAIN reply's content cannot be aggregated, or ``None`` when it can."""
    content = reply.content
    if set(content.keys()) != {protocol.ARRAYS, protocol.PRIVACY}:
        return (f"expected exactly the records {protocol.ARRAYS!r} and {protocol.PRIVACY!r}, "
                f"got {sorted(content.keys())}")
    if protocol.PRIVACY not in content.config_records or protocol.ARRAYS not in content.array_records:
        return "records of the wrong kind"
    try:
        reported = protocol.read_charge(content.config_records[protocol.PRIVACY])
    except protocol.ProtocolError as err:
        return f"unreadable privacy record: {err}"
    if reported != charge:
        return f"reported {reported} differs from the booked {charge}"
    arrays = content.array_records[protocol.ARRAYS]
    if array_spec(arrays) != array_spec(global_arrays):
        return "arrays do not match the global model's names, shapes and dtypes"
    squared = 0.0
    for name, array in arrays.items():
        values = array.numpy()
        if not np.isfinite(values).all():
            return f"non-finite values in {name!r}"
        squared += float(np.sum((values.astype(np.float64) - global_arrays[name].numpy().astype(np.float64)) ** 2))
    if not math.sqrt(squared) <= max_norm:
        return f"update norm {math.sqrt(squared):.4g} exceeds the plan's bound {max_norm:.4g}"
    return None


def check_evaluate_reply(reply: Message, charge: Charge) -> str | None:
    """Why an EVALUATE reply cannot be used, or ``None`` when it can."""
    content = reply.content
    if set(content.keys()) != {protocol.METRICS, protocol.PRIVACY} or protocol.METRICS not in content.metric_records:
        return f"expected exactly the records {protocol.METRICS!r} and {protocol.PRIVACY!r}"
    try:
        reported = protocol.read_charge(content.config_records[protocol.PRIVACY])
    except (KeyError, protocol.ProtocolError) as err:
        return f"unreadable privacy record: {err}"
    if reported != charge:
        return f"reported {reported} differs from the booked {charge}"
    metrics = content.metric_records[protocol.METRICS]
    if set(metrics.keys()) != protocol.EVALUATE_METRICS:
        return f"metrics must be exactly {sorted(protocol.EVALUATE_METRICS)}"
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in metrics.values()):
        return "metrics must be finite numbers"
    return None
