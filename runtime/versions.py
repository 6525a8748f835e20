"""Prism's version and its dependencies', from installed package metadata: nothing is
imported, so asking costs milliseconds and works even where a package is broken."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "prism-runtime"
DEPENDENCIES = ("onnx", "onnxruntime", "numpy", "textual", "streamlit")


def installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def versions(packages: tuple[str, ...] = DEPENDENCIES) -> dict[str, str]:
    """{"prism": ..., "python": ..., package: version for each of `packages`}."""
    return {"prism": installed(DISTRIBUTION), "python": platform.python_version(),
            **{p: installed(p) for p in packages}}
