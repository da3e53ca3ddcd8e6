"""The library never imports the apps (issue 34): nothing under ``fedpriv/`` imports
``clients``, ``server`` or ``simulations``, so the audit calls the very functions the apps
call (``fedpriv.federation.userlevel_steps``, ``fedpriv.federation.releases``), not copies."""

import re
from pathlib import Path

APP_IMPORT = re.compile(r"^\s*(from|import) (clients|server|simulations)\b", re.MULTILINE)


def test_nothing_under_fedpriv_imports_the_apps():
    library = Path(__file__).resolve().parents[2] / "fedpriv"
    offenders = [f"{path.relative_to(library.parent)}: {match.group(0).strip()}"
                 for path in sorted(library.rglob("*.py")) for match in APP_IMPORT.finditer(path.read_text())]
    assert not offenders, offenders
    assert any(library.joinpath("audit").rglob("*.py"))  # the scan saw the audit
