"""Package names that load on first use (PEP 562), so importing one light submodule of
a package (the driver's reader, a device's config) does not import all the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `homes[name]` when `name` is first asked for."""
    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
