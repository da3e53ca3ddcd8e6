"""How one run-config key is defined: ``setting(default, help, ...)``, a dataclass field whose
metadata says everything the key's users need (its bound, what "unset" means, its flag), and
``Key``, the key as those users read it: the settings' parser (``fedpriv.federation.settings``),
the simulations' flags (``simulations._cli``), ``pyproject.toml``'s ``[tool.flwr.app.config]``
and the docs' table (``fedpriv.federation.settings_docs``). A setting is written once, as its
field in ``fedpriv.federation.settings``.

TOML has no null, so a setting whose value may be unset (``None``) is spelled ``0`` or ``""``
in the run config (``unset_as``: ``-1`` for the noise multiplier, where 0 is a valid σ); that
spelling is read here, at the edge, and nowhere else. Standard library only: the command line
reads the definitions before torch, Flower or Ray load.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


class SettingsError(ValueError):
    """A run-config value is missing, mistyped, out of range, or not used by the run's mode."""


@dataclass(frozen=True)
class Bound:
    """The range of a number; a float must also be finite unless ``finite`` is false."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    even: bool = False
    finite: bool = True

    def holds(self, value: float) -> bool:
        if self.finite and not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below and not (self.even and value % 2)

    @property
    def text(self) -> str:
        """``>= 1``, ``in (0, 1]``, ``even and >= 0``: what a value must be."""
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        return ("finite and " if self.finite and self.low_open and self.high is None else "") + \
            ("even and " if self.even else "") + text


POSITIVE = Bound(low=0, low_open=True)
AT_LEAST_1 = Bound(low=1)
AT_LEAST_0 = Bound(low=0)
UNIT = Bound(low=0, high=1)


def setting(default: Any, help: str, *, bound: Bound | None = None, unset: str | None = None,
            unset_as: Any = None, choices: tuple[str, ...] | None = None, flag: bool = True,
            metavar: str | None = None, path: bool = False, elsewhere: str = "") -> Any:
    """A run-config key as a dataclass field. ``help`` is its flag's help and its docs row;
    ``unset``: what ``None`` means (a value that may be unset); ``unset_as``: its TOML spelling
    where not 0 / ""; ``choices``: the values of a string (an enum's: its values); ``flag``:
    whether the simulations have ``--<key>`` for it (not where the command sets it itself);
    ``path``: a folder, made absolute by the simulations; ``elsewhere``: the name Flower or
    Opacus gives it, and why this one differs."""
    return dataclasses.field(default=default, metadata={
        "help": help, "bound": bound, "unset": unset, "unset_as": unset_as, "choices": choices, "flag": flag,
        "metavar": metavar, "path": path, "elsewhere": elsewhere})


@dataclass(frozen=True)
class Key:
    """One run-config key, as its field defines it."""

    name: str  # kebab-case: the run config's key and the flag's name
    attr: str  # the settings' attribute
    kind: type  # int, float, str or bool (an enum's value is a str with choices)
    optional: bool  # may be None (unset)
    default: Any  # None, or a plain value (an enum's value)
    help: str
    bound: Bound | None
    unset: str | None
    unset_as: Any  # the TOML spelling of None
    choices: tuple[str, ...] | None
    flag: bool
    metavar: str | None
    path: bool
    elsewhere: str
    enum: str | None  # the enum's class name, for a value that is one

    @classmethod
    def of(cls, field: dataclasses.Field[Any]) -> Key:
        """The key of a ``setting`` field of a module written with ``from __future__ import
        annotations`` (its type is the annotation's text: ``int | None``, ``Partition``)."""
        if not isinstance(field.type, str):
            raise TypeError(f"{field.name}: define settings under `from __future__ import annotations`")
        annotation = field.type
        base = annotation.removesuffix(" | None")
        meta = field.metadata
        kind = _SCALARS.get(base, str)
        optional = base != annotation
        default = field.default.value if hasattr(field.default, "value") else field.default
        unset_as = meta["unset_as"] if meta["unset_as"] is not None else ("" if kind is str else kind(0))
        return cls(name=field.name.replace("_", "-"), attr=field.name, kind=kind, optional=optional,
                   default=default, help=meta["help"], bound=meta["bound"], unset=meta["unset"],
                   unset_as=unset_as if optional else None, choices=meta["choices"], flag=meta["flag"],
                   metavar=meta["metavar"], path=meta["path"], elsewhere=meta["elsewhere"],
                   enum=None if base in _SCALARS else base)

    @property
    def toml_default(self) -> Any:
        """The default as ``pyproject.toml`` spells it (``unset_as`` for None)."""
        return self.unset_as if self.default is None else self.default

    def parse(self, value: Any) -> Any:
        """A run-config value to a plain one (an enum's value as its string; ``None``: unset);
        ``SettingsError`` naming the key for a wrong type."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.optional and value == self.unset_as and (number or isinstance(value, str)) \
                and isinstance(value, str) == isinstance(self.unset_as, str):
            return None
        fits = {bool: isinstance(value, bool), str: isinstance(value, str), float: number,
                int: number and float(value).is_integer()}[self.kind]
        if not fits:
            expected = {bool: "true or false", str: "a string", float: "a number", int: "an integer"}[self.kind]
            raise SettingsError(f"{self.name}: bad value {value!r} (expected {expected})")
        return self.kind(value)

    def check(self, value: Any) -> None:
        """``SettingsError`` for a value (not None) out of the key's range or choices."""
        if self.choices is not None and str(value) not in self.choices:
            raise SettingsError(f"{self.name} must be one of {', '.join(self.choices)}, got {str(value)!r}")
        if self.bound is not None and not self.bound.holds(value):
            hint = f" ({self.unset_as}: {self.unset})" if self.optional and self.unset else ""
            raise SettingsError(f"{self.name} must be {self.bound.text}{hint}, got {value}")
