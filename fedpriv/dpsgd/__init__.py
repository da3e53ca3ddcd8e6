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

from typing import TYPE_CHECKING

from fedpriv.dpsgd.config import Clipping, ConfigError, DPSGDConfig, GradSampleMode, steps_per_epoch
from fedpriv.lazy import lazy_names

if TYPE_CHECKING:
    from fedpriv.dpsgd.engine import TrainReport, train_dpsgd
    from fedpriv.dpsgd.modules import UnsupportedModuleError

_TORCH: dict[str, str] = {"TrainReport": "engine", "train_dpsgd": "engine", "UnsupportedModuleError": "modules"}
__getattr__ = lazy_names(__name__, _TORCH)

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
