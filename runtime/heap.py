"""Giving memory a load freed back to the system. A network's weights are copied as it
loads (serialized, handed to onnxruntime, prepacked) and freed again, and glibc keeps
what is freed in the heap of the thread that freed it, where the next session, made on
another thread, does not reuse it: a 400 MB network loaded over two cpu devices left its
process at 1.66 GB, 0.87 GB once trimmed (docs/performance.md, "Loading large models").
A trim costs microseconds. Elsewhere than glibc there is nothing to trim."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _trimmer() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl: no malloc_trim, nothing kept
        return None


_TRIM = _trimmer()


def give_back() -> None:
    """Return the heap's free pages to the system."""
    if _TRIM is not None:
        _TRIM(0)
