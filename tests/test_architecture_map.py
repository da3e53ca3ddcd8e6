"""docs/architecture.md's map lists every module of the five packages (issue 34: a map
that is true). The map is its first code block: a folder line ``name/`` opens a folder
(closing those indented as deep or deeper), and each ``name.py`` on a line belongs to the
folder opened on that line, else to the innermost folder indented less than the line.
Package ``__init__.py`` files are the folders' own lines; every other module is named."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedpriv", "clients", "server", "simulations", "benchmarks")
FOLDER = re.compile(r"^( *)([\w.]+)/(?:\s|$)")
MODULE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def mapped(text: str) -> set[str]:
    """The module paths the map's tree names."""
    block = text.split("```\n", 2)[1]
    folders: list[tuple[int, str]] = []  # (indentation, path)
    found = set()
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        opened = FOLDER.match(line)
        if opened:
            folders = [f for f in folders if f[0] < indent]
            folders.append((indent, "/".join([*(p for _, p in folders[-1:]), opened.group(2)])))
            owner = folders[-1][1]
        else:
            owner = next((p for i, p in reversed(folders) if i < indent), "")
        found |= {f"{owner}/{name}" for name in MODULE.findall(line)}
    return found


def test_every_module_is_on_the_map():
    modules = {p.relative_to(ROOT).as_posix() for package in PACKAGES for p in (ROOT / package).rglob("*.py")
               if p.name != "__init__.py"}
    missing = sorted(modules - mapped((ROOT / "docs" / "architecture.md").read_text()))
    assert not missing, f"docs/architecture.md's map does not name: {', '.join(missing)}"


def test_the_map_names_no_module_that_is_gone():
    names = mapped((ROOT / "docs" / "architecture.md").read_text())
    assert names and not sorted(n for n in names if not (ROOT / n).is_file())


def test_the_reader_follows_folders():
    tree = "x\n```\npkg/  a package\n  a.py  one; b.py two\n  sub/\n    c.py\n                  d.py\n  e.py\n```\n"
    assert mapped(tree) == {"pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/sub/d.py", "pkg/e.py"}
