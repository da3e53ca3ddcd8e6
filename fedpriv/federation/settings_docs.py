"""``pyproject.toml``'s ``[tool.flwr.app.config]`` and the docs' run-config tables, written
from the settings' definitions (``fedpriv.federation.settings``), never by hand:
``python -m fedpriv.federation.settings_docs`` rewrites them; ``--check`` exits 1 where a
committed one differs (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from fedpriv.federation import modes
from fedpriv.federation.keys import Key
from fedpriv.federation.settings import KEYS, SELECTORS, USER_LEVEL_KEYS, used_by
from fedpriv.project import PROJECT_ROOT

ORDER = (*SELECTORS, *(name for name in KEYS if name not in SELECTORS))
"""The keys as the generated texts list them: the mode first."""

SECTION = "[tool.flwr.app.config]"
TABLE_START = "<!-- the run-config table: python -m fedpriv.federation.settings_docs writes it -->"
TABLE_END = "<!-- end of the run-config table -->"
TABLES = {"docs/federated.md": ORDER, "docs/user-level.md": USER_LEVEL_KEYS}
"""Each doc with a generated table, and its keys."""


def toml_value(value: object) -> str:
    """``value`` as TOML spells it."""
    return json.dumps(value) if isinstance(value, (bool, str)) else repr(value)


def default_text(key: Key) -> str:
    """A key's default for a reader: its value, or what unset means (and how TOML spells it)."""
    if key.default is None:
        return f"unset ({toml_value(key.unset_as)}): {key.unset}"
    return toml_value(key.default)


GENERATED = (
    "# Written by python -m fedpriv.federation.settings_docs from fedpriv/federation/settings.py: edit there.",
)


def config_section(values: Mapping[str, object] | None = None, header: Iterable[str] = GENERATED) -> str:
    """``[tool.flwr.app.config]``: every key at its default (or its value in ``values``),
    commented with its help, under the comment lines ``header``."""
    values = dict(values or {})
    if unknown := sorted(set(values) - set(KEYS)):
        raise ValueError(f"not fedpriv run-config keys: {', '.join(unknown)}")
    lines = [*header,
             "# TOML has no null: an unset value is spelled as the comment says (0, \"\", or -1 for noise-multiplier).",
             "# Keys in brackets are used by those privacy modes only; another value in another mode is an error.",
             SECTION]
    for name in ORDER:
        key = KEYS[name]
        used = "" if modes.named(used_by(name)) == "all" else f"[{modes.named(used_by(name))}] "
        unset = f" ({toml_value(key.unset_as)}: {key.unset})" if key.default is None else ""
        lines.append(f"{name} = {toml_value(values.get(name, key.toml_default))}  # {used}{key.help}{unset}")
    return "\n".join(lines) + "\n"


def table(names: Iterable[str]) -> str:
    """The markdown table of ``names``: key, flag, modes, default, meaning, Flower's or Opacus' name."""
    rows = ["| key | flag | modes | default | meaning | Flower / Opacus |", "|---|---|---|---|---|---|"]
    for name in names:
        key = KEYS[name]
        flag = f"`--{name}`" if key.flag else "`--clients`" if name == "min-clients" else "—"
        rows.append(f"| `{name}` | {flag} | {modes.named(used_by(name))} | {default_text(key).replace('|', '∣')} | "
                    f"{key.help.replace('|', '∣')} | {key.elsewhere} |")
    return "\n".join(rows)


def with_section(text: str) -> str:
    """pyproject.toml's ``text`` with its run-config section (and the comments above it) written anew."""
    pattern = re.compile(r"(?:^#[^\n]*\n)*^" + re.escape(SECTION) + r"\n(?:^(?!\[)[^\n]*\n?)*", re.M)
    if not pattern.search(text):
        raise ValueError(f"pyproject.toml has no {SECTION}")
    return pattern.sub(lambda _: config_section(), text, count=1)


def with_table(text: str, names: Iterable[str]) -> str:
    """A doc's ``text`` with the table between its markers written anew."""
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return f"{text[:start]}\n{table(names)}\n{text[end:]}"


def generated(root: Path = PROJECT_ROOT) -> dict[Path, str]:
    """Every generated file's path and its text as it should be."""
    pyproject = root / "pyproject.toml"
    texts = {pyproject: with_section(pyproject.read_text())}
    for doc, names in TABLES.items():
        texts[root / doc] = with_table((root / doc).read_text(), names)
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpriv.federation.settings_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a file differs")
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from the settings' definitions: python -m fedpriv.federation.settings_docs",
                  file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
