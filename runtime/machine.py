"""What this machine lets the process use: its memory (`machine_bytes`), which what a
request or an input needs is refused against, and what of it is free now (`free_bytes`),
which a refusal says; and its CPUs (`usable_cpus`), which a session sized to the machine
takes its threads from. In a container both are less than
the node's: a pod's 4 GB and 2 CPUs on a 64 GB, 64-core node, its cgroup's limits, which
the kernel enforces by killing it and by throttling its threads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

from runtime.units import human_bytes

PROC_CGROUP, CGROUP_MOUNT = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
# a memory cgroup's limit and usage files, by version (v2?)
_MEMORY_FILES = {True: ("memory.max", "memory.current"),
                 False: ("memory.limit_in_bytes", "memory.usage_in_bytes")}


def machine_bytes() -> int | None:
    """The memory this process may use: the machine's physical memory, or its cgroup's
    limit where less; None where the system says neither."""
    try:
        physical: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        physical = None
    return min((b for b in (physical, cgroup_limit()) if b is not None), default=None)


def cgroup_limit(own: Path = PROC_CGROUP, mount: Path = CGROUP_MOUNT) -> int | None:
    """The least memory limit set on this process's cgroup or any above it (v2's
    `memory.max`, v1's `memory.limit_in_bytes`), in bytes; None where none is set."""
    texts = (_read(folder / _MEMORY_FILES[v2][0]) for v2, folder in _cgroups("memory", own, mount))
    return min((int(t) for t in texts if t.isdigit()), default=None)  # v2 says "max" if none


def free_bytes(meminfo: Path = MEMINFO, own: Path = PROC_CGROUP, mount: Path = CGROUP_MOUNT
               ) -> int | None:
    """The memory this process could still take: the system's available memory (`meminfo`'s
    MemAvailable), or what a cgroup's limit leaves above its usage where less; None where
    the system says neither."""
    found = [int(line.split()[1]) << 10 for line in _read(meminfo).splitlines()
             if line.startswith("MemAvailable:")]
    for v2, folder in _cgroups("memory", own, mount):
        limit, used = (_read(folder / name) for name in _MEMORY_FILES[v2])
        if limit.isdigit() and used.isdigit():
            found.append(max(int(limit) - int(used), 0))
    return min(found, default=None)


def memory_text(limit: int) -> str:
    """A refusal's end: the machine's memory it was refused against, and what is free."""
    free = free_bytes()
    return f"this machine has {human_bytes(limit)}" + (
        "" if free is None else f", {human_bytes(min(free, limit))} of it free")


def usable_cpus() -> int:
    """The CPUs this process may run on: those it is pinned to, fewer where its cgroup's
    quota is less (rounded up); at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity outside Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpus()
    return max(1, min(cpus, math.ceil(quota)) if quota is not None else cpus)


def cgroup_cpus(own: Path = PROC_CGROUP, mount: Path = CGROUP_MOUNT) -> float | None:
    """The least CPU quota set on this process's cgroup or any above it, in CPUs (v2's
    `cpu.max`, "quota period"; v1's `cpu.cfs_quota_us` over `cpu.cfs_period_us`); None
    where none is set."""
    quotas = []
    for v2, folder in _cgroups("cpu", own, mount):
        quota, _, period = _read(folder / "cpu.max").partition(" ") if v2 else (
            _read(folder / "cpu.cfs_quota_us"), "", _read(folder / "cpu.cfs_period_us"))
        if quota.isdigit() and period.isdigit() and int(period):
            quotas.append(int(quota) / int(period))
    return min(quotas, default=None)


def _cgroups(controller: str, own: Path, mount: Path) -> Iterator[tuple[bool, Path]]:
    """(v2?, folder) of this process's cgroup and of each above it, deepest first, as
    `own` (/proc/self/cgroup) names them: in the v2 hierarchy (at `mount`), and in v1's
    `controller` one (at `mount`/`controller`). Their roots come last: in a container
    whose cgroup is mounted as the root, only they hold its limits."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(":", 2)  # hierarchy id : controllers : path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            v2, base = True, mount
        elif controller in controllers.split(","):
            v2, base = False, mount / controller
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            yield v2, base.joinpath(*parts[:depth])


def _read(path: Path) -> str:
    """A cgroup file's text, stripped; "" where there is none."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
