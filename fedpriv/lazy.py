"""Names a package exports but imports on first use (PEP 562), so that importing the package
for its light parts (a plan, a configuration) does not import torch."""

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(package: str, submodules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``submodules`` (name → submodule)
    imported from ``package.<submodule>`` when first asked for; any other name an
    ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name not in submodules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{submodules[name]}"), name)

    return __getattr__
