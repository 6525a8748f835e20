"""Import contracts around the dashboards, read from the source (nothing is imported):
`app` reaches the UIs only through the two launchers; the UIs reach no CLI launcher; the view
model and the UIs never touch the runtime's host side, only a RuntimeSource."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = {"app/tui_cmd.py": "ui_tui", "app/web_cmd.py": "ui_web"}
HOST_SIDE = ("runtime.host.manager", "runtime.host.dispatch", "runtime.provision.network",
             "runtime.devices.manager", "runtime.executor.executor",
             "runtime.provision.provisioner",
             "app.live", "app.loadgen", "app.replay")
UI_NEVER = ("app.cli", "app.run_cmd", "app.partition_cmd", "app.bench_cmd", "app.tui_cmd",
            "app.web_cmd", "runtime.observe.metrics", "runtime.observe.events", "runtime.devices",
            *HOST_SIDE)


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def files(*packages: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imports(p)
            for package in packages for p in sorted((ROOT / package).rglob("*.py"))}


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_app_reaches_the_uis_only_through_their_launchers() -> None:
    bad = {f: sorted(m for m in found if under(m, ("ui_tui", "ui_web"))
                     and LAUNCHERS.get(f) != m.split(".")[0])
           for f, found in files("app").items()}
    assert not {f: m for f, m in bad.items() if m}
    assert "ui_tui" in imports(ROOT / "app/tui_cmd.py")  # the check sees a nested import


def test_uis_read_only_the_view_model() -> None:
    bad = {f: sorted(m for m in found if under(m, UI_NEVER))
           for f, found in files("ui_tui", "ui_web").items()}
    assert not {f: m for f, m in bad.items() if m}


def test_the_view_model_needs_no_host() -> None:
    bad = {f: sorted(m for m in found if under(m, HOST_SIDE) or under(m, ("ui_tui", "ui_web")))
           for f, found in files("app/dashboard").items()}
    assert not {f: m for f, m in bad.items() if m}
    assert files("app/dashboard")  # there is a view model to check
