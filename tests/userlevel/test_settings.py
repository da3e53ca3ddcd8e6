"""The user-level run-config keys are checked where every key is (``RunSettings``), so a
simulation refuses a bad one before Ray starts."""

import pytest

from fedpriv.federation.settings import RunSettings, ServerRandomness, SettingsError


def test_the_user_level_keys_parse_with_their_unset_sentinels():
    s = RunSettings.from_run_config({"privacy": "user", "cohort": 0, "clip-quantile": 0.0, "clip-count-noise": 0.0,
                                     "noise-multiplier": 1.0})
    assert (s.cohort, s.clip_quantile, s.clip_count_noise, s.server_randomness) == \
        (None, None, None, ServerRandomness.SECURE)


@pytest.mark.parametrize(("config", "match"), [
    ({"privacy": "user"}, "needs noise-multiplier"),
    ({"privacy": "user", "noise-multiplier": 1.0, "clip-quantile": 0.5, "clip-count-noise": 0.5}, "half the noise"),
    ({"clip-quantile": 1.0}, "clip-quantile"),
    ({"user-clip": -1.0}, "user-clip"),
    ({"cohort": 1.5}, "cohort"),
    ({"server-randomness": "os"}, "server-randomness"),
])
def test_a_bad_user_level_key_is_refused(config, match):
    with pytest.raises(SettingsError, match=match):
        RunSettings.from_run_config(config)
