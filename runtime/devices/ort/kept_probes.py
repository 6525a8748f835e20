"""What kernel probes found (`kernels._load_error`), kept in the user's cache between
processes. A probe is a session of one node (about 0.2 ms), and a network probes each
node kind and types it has: a Qwen2-MoE export about 900 of them, 0.2 s of its first load
in every new process (`prism run`, `prism serve`), which a later one now reads back.

One JSON line per probe, `[key, error or null]`, appended in a file per onnxruntime
version and build (`probes/`), read once per process and decoded only where looked up
(decoding every line of a file of 112,000 took 0.2 s of each new process's first load;
keying them, 0.04 s); a file grown past `LIMIT` bytes is started anew.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from pathlib import Path

from runtime.user_cache import append_line, cache_dir

LIMIT = 4 << 20  # about 100,000 probes
_KEY = slice(2, 34)  # where a line `["<32 hex digits>",...]` holds its key


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


_read: dict[Path, dict[str, str]] = {}


def _lines() -> dict[str, str]:
    """This process's cache directory's lines, undecoded, by key; a later line wins."""
    path = _path()
    if path not in _read:
        text = ""
        with contextlib.suppress(OSError):
            if path.stat().st_size > LIMIT:
                path.unlink()
            text = path.read_text(encoding="utf-8", errors="replace")
        _read[path] = {line[_KEY]: line for line in text.splitlines()
                       if line[_KEY.stop:_KEY.stop + 2] == '",'}
    return _read[path]


def found(probe: str) -> tuple[str | None] | None:
    """`(error,)` as a process probed `probe` before (error None: it loaded), or None when
    none did or its line is damaged."""
    if (line := _lines().get(probe)) is None:
        return None
    with contextlib.suppress(ValueError):  # damaged
        value = json.loads(line)
        if (isinstance(value, list) and len(value) == 2 and value[0] == probe
                and (value[1] is None or isinstance(value[1], str))):
            return (value[1],)
    return None


def keep(probe: str, error: str | None) -> None:
    _lines()[probe] = json.dumps([probe, error])
    append_line(_path(), [probe, error])
