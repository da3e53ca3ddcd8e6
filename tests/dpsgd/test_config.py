import math

import pytest

from fedpriv.dpsgd import Clipping, ConfigError, DPSGDConfig, GradSampleMode, steps_per_epoch


def test_defaults_and_string_options_parse_to_enums():
    cfg = DPSGDConfig(noise_multiplier=1.1, max_grad_norm=1.0, sample_rate=0.01, clipping="per_layer")
    assert cfg.clipping is Clipping.PER_LAYER
    assert cfg.grad_sample_mode is GradSampleMode.AUTO
    assert cfg.max_physical_batch_size == 512 and not cfg.secure_mode
    assert cfg.noise_std == pytest.approx(1.1)


def test_non_private_schedule_is_valid_and_has_no_noise():
    cfg = DPSGDConfig(noise_multiplier=0, max_grad_norm=math.inf, sample_rate=0.5)
    assert cfg.noise_std == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"max_grad_norm": math.inf}, "noise_multiplier=0"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"max_physical_batch_size": 0}, "max_physical_batch_size"),
        ({"clipping": "global"}, "clipping"),
        ({"grad_sample_mode": "hooks"}, "grad_sample_mode"),
    ],
)
def test_invalid_settings_are_refused_with_the_field_named(kwargs, message):
    settings = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "sample_rate": 0.1} | kwargs
    with pytest.raises(ConfigError, match=message):
        DPSGDConfig(**settings)


@pytest.mark.parametrize(("q", "expected"), [(1.0, 1), (0.01, 100), (0.3, 3), (256 / 60000, 234)])
def test_steps_per_epoch_is_one_over_q(q, expected):
    assert steps_per_epoch(q) == expected


def test_for_target_epsilon_uses_the_shared_calibration():
    privacy = pytest.importorskip("fedpriv.privacy")
    if not hasattr(privacy, "calibrate_noise_multiplier"):
        pytest.skip("fedpriv.privacy.calibrate_noise_multiplier not available yet")
    cfg = DPSGDConfig.for_target_epsilon(2.0, 1e-5, steps=1000, sample_rate=0.01, max_grad_norm=1.0)
    event = privacy.dpsgd_event(cfg.noise_multiplier, 0.01, 1000)
    assert privacy.epsilon_of(event, 1e-5) <= 2.0
    assert cfg.noise_multiplier == privacy.calibrate_noise_multiplier(2.0, 1e-5, 0.01, 1000)
