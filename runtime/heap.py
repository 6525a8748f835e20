"""Giving memory a load freed back to the system. A network's weights are copied as it
loads (serialized, handed to onnxruntime, prepacked) and freed again, and glibc keeps
what is freed in the heap of the thread that freed it, where the next session, made on
another thread, does not reuse it: a 400 MB network loaded over two cpu devices left its
process at 1.66 GB, 0.87 GB once trimmed (docs/performance.md, "Loading large models").
A trim costs microseconds. Elsewhere than glibc there is nothing to trim.

And how much memory this process may use (`machine_bytes`), which what a request or an
input needs is refused against."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path


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


def machine_bytes() -> int | None:
    """The memory this process may use: the machine's physical memory, or less where its
    cgroup sets a limit (a container's: a pod's 4 GB on a 64 GB node), which the kernel
    enforces by killing it; None where the system says neither."""
    try:
        physical: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        physical = None
    return min((b for b in (physical, cgroup_limit()) if b is not None), default=None)


def cgroup_limit(own: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")
                 ) -> int | None:
    """The least memory limit set on this process's cgroup or any above it (cgroup v2's
    `memory.max`, v1's `memory.limit_in_bytes`), as `own` names it under `mount`; the
    mount's own, where a container's is mounted as the root. None where none is set."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy id : controllers : path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            base, name = mount, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = mount / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            try:
                text = (base.joinpath(*parts[:depth]) / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():  # v2 says "max" where there is no limit
                limits.append(int(text))
    return min(limits, default=None)
