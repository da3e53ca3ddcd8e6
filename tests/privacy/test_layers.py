"""Accounting is the bottom layer: no module of ``fedpriv.privacy`` imports training, models,
the distributed encoding, the planner or the apps, at the top or inside a function (issue 34).
Only its command line, ``fedpriv.privacy.__main__``, hands ``plan`` to ``fedpriv.planning``."""

import ast
import subprocess
import sys
from pathlib import Path

import fedpriv.privacy
from tests.timeouts import scaled

PACKAGE = Path(fedpriv.privacy.__file__).parent
ALLOWED = ("fedpriv.privacy", "fedpriv.files")
"""What accounting may import of this repository: itself and the atomic file write."""


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_module_of_the_accounting_layer_imports_one_above_it():
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"]
    assert len(modules) >= 10
    above = {str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n.split(".")[0] in
                                                 ("fedpriv", "clients", "server", "simulations")
                                                 and not n.startswith(ALLOWED))
             for p in modules}
    assert {path: names for path, names in above.items() if names} == {}


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fedpriv.training import default_plan\n    import fedpriv.models\n")
    assert _imports(module) == {"fedpriv.training", "fedpriv.models"}


def test_importing_every_accounting_module_loads_nothing_above_it():
    modules = sorted(".".join(p.relative_to(PACKAGE.parent.parent).with_suffix("").parts)
                     for p in PACKAGE.rglob("*.py") if p.name not in ("__main__.py", "__init__.py"))
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
            "print(sorted(m for m in sys.modules if m.startswith(('fedpriv.', 'clients', 'server', 'simulations'))"
            " and not m.startswith(('fedpriv.privacy', 'fedpriv.files')) and m != 'fedpriv'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120),
                          check=True)
    assert done.stdout.strip() == "[]"
