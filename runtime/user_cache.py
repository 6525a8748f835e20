"""The user's cache directory, where Prism keeps between loads what it measured or ran,
and its entries: JSON files written atomically (a reader sees the old file or the new),
read as None when missing or damaged, or JSON lines appended one at a time (their
reader skips damaged ones); neither is kept when the directory cannot be written.

The directory is `$PRISM_CACHE_DIR` if set (tests point it at a temporary folder), else
the platform's cache folder: `$XDG_CACHE_HOME/prism` or `~/.cache/prism` on Linux,
`~/Library/Caches/prism` on macOS, `%LOCALAPPDATA%\\prism\\Cache` on Windows.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

CACHE_ENV = "PRISM_CACHE_DIR"


def cache_dir() -> Path:
    """Where Prism keeps what it measured (not created here)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen)
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "prism"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local")) / "prism" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "prism"


def read_entry(path: Path) -> Any:
    """The JSON kept at `path`; None if there is none or it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_entry(path: Path, entry: Any) -> Path | None:
    """Keep `entry` at `path`; the path, or None when the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp",
                                         delete=False, encoding="utf-8") as tmp:
            json.dump(entry, tmp)
        os.replace(tmp.name, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp.name)
        return None
    return path


def append_line(path: Path, entry: Any) -> bool:
    """Add `entry` as one line at the end of `path`, in one write to a file opened for
    appending, so lines that processes add at once do not interleave; False when the
    cache cannot be written."""
    line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True
