"""The simulation modules import each other without a circle, counting the imports inside
functions too (a lazy circle still ties the modules together)."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SIMULATIONS = Path(__file__).resolve().parents[1] / "simulations"


def _imports(path: Path) -> set[str]:
    """The ``simulations.*`` modules ``path`` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("simulations."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("simulations."))
    return found


def test_the_simulation_modules_import_each_other_without_a_circle():
    graph = {f"simulations.{p.stem}": _imports(p) for p in SIMULATIONS.glob("*.py")}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None
