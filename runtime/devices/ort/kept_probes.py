"""What kernel probes found (`kernels._load_error`), kept in the user's cache between
processes. A probe is a session of one node (about 0.2 ms), and a network probes each
node kind and types it has: a Qwen2-MoE export about 900 of them, 0.2 s of its first load
in every new process (`prism run`, `prism serve`), which a later one now reads back.

One JSON line per probe, `[key, error or null]`, appended in a file per onnxruntime
version and build (`probes/`), read once per process; a file grown past `LIMIT` bytes
is started anew.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from runtime.user_cache import append_line, cache_dir, read_lines

LIMIT = 16 << 20  # about 100,000 probes


@functools.cache
def _build() -> str:
    import onnxruntime as ort

    return f"{ort.__version__}-{hashlib.sha256(ort.get_build_info().encode()).hexdigest()[:12]}"


def key(*parts: bytes) -> str:
    """One probe's key: a digest of what makes its session."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def _path() -> Path:
    return cache_dir() / "probes" / f"onnxruntime-{_build()}.jsonl"


_read: dict[Path, dict[str, str | None]] = {}


def kept() -> dict[str, str | None]:
    """What probes found, by key, as this process's cache directory holds them."""
    path = _path()
    if path not in _read:
        try:
            if path.stat().st_size > LIMIT:
                path.unlink()
        except OSError:
            pass
        _read[path] = {line[0]: line[1] for line in read_lines(path)
                       if isinstance(line, list) and len(line) == 2 and isinstance(line[0], str)
                       and (line[1] is None or isinstance(line[1], str))}
    return _read[path]


def keep(probe: str, error: str | None) -> None:
    kept()[probe] = error
    append_line(_path(), [probe, error])
