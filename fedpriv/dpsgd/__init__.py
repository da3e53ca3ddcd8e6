"""DP-SGD engine: Poisson lots, per-example clipping, Gaussian noise, one event per call.

```python
cfg = DPSGDConfig(noise_multiplier=σ, max_grad_norm=C, sample_rate=q)
report = train_dpsgd(model, features, labels, config=cfg, steps=T, optimizer=opt,
                     sampling_generator=g_sample, noise_generator=g_noise)
report.events == (dpsgd_event(σ, q, T),)
```

The engine's names (``engine``, ``modules``) load on first use, so that a plan's
configuration (``config``) does not import torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedpriv.dpsgd.config import Clipping, ConfigError, DPSGDConfig, GradSampleMode, steps_per_epoch

if TYPE_CHECKING:
    from fedpriv.dpsgd.engine import TrainReport, train_dpsgd
    from fedpriv.dpsgd.modules import UnsupportedModuleError

_TORCH: dict[str, str] = {"TrainReport": "engine", "train_dpsgd": "engine", "UnsupportedModuleError": "modules"}


def __getattr__(name: str) -> Any:
    """A name of ``engine`` or ``modules``, imported on first use (PEP 562)."""
    if name not in _TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_TORCH[name]}"), name)


__all__ = [
    "Clipping",
    "ConfigError",
    "DPSGDConfig",
    "GradSampleMode",
    "TrainReport",
    "UnsupportedModuleError",
    "steps_per_epoch",
    "train_dpsgd",
]
