"""Which privacy mode uses which setting: one table, so that a setting the chosen mode would
ignore is an error where settings enter (the federated commands' flags), not a silent no-op.

A mode is ``privacy`` with, for user level, who adds the noise (``user-noise``). Keys are
the run config's (kebab-case; each flag is ``--<key>``). A key not in ``USED_BY`` is used
by every mode (``rounds``, ``delta``, ``seed``, …; ``noise-multiplier`` and
``target-epsilon`` are in every mode, with a meaning of each mode's own: docs/federated.md).
Pure data, no imports beyond the standard library: the command line consults it before
torch, Flower or Ray load.
"""

from __future__ import annotations

from collections.abc import Iterable

LOCAL, DISTRIBUTED, USER_CENTRAL, USER_DISTRIBUTED = "local", "distributed", "user-central", "user-distributed"
MODES = (LOCAL, DISTRIBUTED, USER_CENTRAL, USER_DISTRIBUTED)
USER = frozenset({USER_CENTRAL, USER_DISTRIBUTED})
SECURE_SUM = frozenset({DISTRIBUTED, USER_DISTRIBUTED})

USER_LEVEL_KEYS = ("cohort", "user-clip", "user-noise", "clip-quantile", "clip-lr", "clip-count-noise",
                   "clip-warmup-rounds", "clip-warmup-lr")
"""The run-config keys of user level alone (each flag is ``--<key>``)."""

USED_BY: dict[str, frozenset[str]] = {
    # per-example DP-SGD: user level trains each client plainly and clips its whole delta (user-clip)
    "max-grad-norm": frozenset({LOCAL, DISTRIBUTED}),
    # distributed DP-SGD is one secure sum and one server step per round: no local epochs
    "local-epochs": frozenset({LOCAL}) | USER,
    # user level's cohort is a Poisson draw of `cohort` clients, not a fraction
    "fraction-train": frozenset({LOCAL, DISTRIBUTED}),
    "lattice-rounding": SECURE_SUM,
    "secagg-neighbours": SECURE_SUM,
    **{key: USER for key in USER_LEVEL_KEYS},
}
"""Run-config key → the modes that use it (absent: every mode)."""

DESCRIPTIONS = {LOCAL: "--privacy local", DISTRIBUTED: "--privacy distributed",
                USER_CENTRAL: "--privacy user (central noise)",
                USER_DISTRIBUTED: "--privacy user --user-noise distributed"}
"""Each mode in the command line's words."""


def mode_of(privacy: str, user_noise: str) -> str:
    """The mode of a run's ``privacy`` and ``user-noise`` (the latter counts at user level only)."""
    if privacy == "user":
        return USER_DISTRIBUTED if user_noise == "distributed" else USER_CENTRAL
    if privacy not in (LOCAL, DISTRIBUTED):
        raise ValueError(f"privacy must be local, distributed or user, got {privacy!r}")
    return privacy


def unused(keys: Iterable[str], mode: str) -> list[str]:
    """Those of ``keys`` (set by the user) that ``mode`` does not use, in the given order."""
    return [key for key in keys if mode not in USED_BY.get(key, MODES)]


def unused_reason(key: str, mode: str) -> str:
    """Why ``key`` is refused in ``mode``: ``--privacy local does not use it (only --privacy user)``."""
    used = USED_BY.get(key, frozenset(MODES))
    words = [DESCRIPTIONS[m] for m in MODES if m in used - USER] + (
        ["--privacy user"] if USER <= used else [DESCRIPTIONS[m] for m in MODES if m in used & USER])
    return f"{DESCRIPTIONS[mode]} does not use it (only {' or '.join(words)})"
