"""The privacy modes' names, and their words in an error: a mode is ``privacy`` with, for
user level, who adds the noise (``user-noise``). Which mode uses which key is
``fedpriv.federation.settings.USED_BY`` (the groups of the settings' fields).
"""

from __future__ import annotations

LOCAL, DISTRIBUTED, USER_CENTRAL, USER_DISTRIBUTED = "local", "distributed", "user-central", "user-distributed"
MODES = (LOCAL, DISTRIBUTED, USER_CENTRAL, USER_DISTRIBUTED)
USER = frozenset({USER_CENTRAL, USER_DISTRIBUTED})
SECURE_SUM = frozenset({DISTRIBUTED, USER_DISTRIBUTED})

DESCRIPTIONS = {LOCAL: "--privacy local", DISTRIBUTED: "--privacy distributed",
                USER_CENTRAL: "--privacy user (central noise)",
                USER_DISTRIBUTED: "--privacy user --user-noise distributed"}
"""Each mode in the command line's words."""

RUN_CONFIG_WORDS = {LOCAL: "privacy = 'local'", DISTRIBUTED: "privacy = 'distributed'",
                    USER_CENTRAL: "privacy = 'user' (central noise)",
                    USER_DISTRIBUTED: "privacy = 'user', user-noise = 'distributed'"}
"""Each mode in the run config's words."""


def mode_of(privacy: str, user_noise: str) -> str:
    """The mode of a run's ``privacy`` and ``user-noise`` (the latter counts at user level only)."""
    if privacy == "user":
        return USER_DISTRIBUTED if user_noise == "distributed" else USER_CENTRAL
    if privacy not in (LOCAL, DISTRIBUTED):
        raise ValueError(f"privacy must be local, distributed or user, got {privacy!r}")
    return privacy


def described(used: frozenset[str], flags: bool = True) -> str:
    """The modes ``used`` in the command line's words (``--privacy local or --privacy user``)
    or the run config's."""
    words = DESCRIPTIONS if flags else RUN_CONFIG_WORDS
    user = "--privacy user" if flags else "privacy = 'user'"
    return " or ".join([words[m] for m in MODES if m in used - USER] + (
        [user] if USER <= used else [words[m] for m in MODES if m in used & USER]))


def unused_reason(mode: str, used: frozenset[str], flags: bool = True) -> str:
    """Why a key that the modes ``used`` use is refused in ``mode``, in the command line's
    words (``--privacy local does not use it (only --privacy user)``) or the run config's."""
    return f"{(DESCRIPTIONS if flags else RUN_CONFIG_WORDS)[mode]} does not use it (only {described(used, flags)})"


def named(used: frozenset[str]) -> str:
    """The modes ``used`` in a word each (``local, distributed``; ``user``: both user modes;
    ``all``: every mode)."""
    if used == frozenset(MODES):
        return "all"
    return ", ".join([m for m in MODES if m in used - USER] + (["user"] if USER <= used else sorted(used & USER)))
