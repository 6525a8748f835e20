"""What the machine lets the process use, as a container limits it: its cgroup's memory
limit and CPU quota, read from cgroup v1 and v2 layouts made here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime import machine


def _layout(root: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup reading `own` and a cgroup mount holding `files` (path -> text)."""
    for path, text in files.items():
        (root / "fs" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "fs" / path).write_text(text + "\n")
    (root / "cgroup").write_text(own)
    return root / "cgroup", root / "fs"


@pytest.mark.parametrize("own, files, expected", [
    # cgroup v2 in a pod: the pod's limit, the least of its own and those above it
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/memory.max": "4294967296",
                                "kubepods/pod1/c1/memory.max": "max",
                                "kubepods/memory.max": "8589934592"}, 4 << 30),
    # v2 with the container's cgroup mounted as the root
    ("0::/\n", {"memory.max": "2147483648"}, 2 << 30),
    # v1 (Docker without a cgroup namespace: its path is not under the mount, its root is)
    ("4:memory:/docker/abc\n3:cpu:/docker/abc\n0::/\n",
     {"memory/memory.limit_in_bytes": "1073741824", "cpu/cpu.shares": "1024"}, 1 << 30),
    # no limit set: v2's "max", v1's largest page-aligned number
    ("0::/user.slice\n", {"user.slice/memory.max": "max"}, None),
    ("9:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712"},
     9223372036854771712),
])
def test_a_containers_memory_limit_is_read_from_its_cgroup(tmp_path, own, files, expected):
    assert machine.cgroup_limit(*_layout(tmp_path, own, files)) == expected


@pytest.mark.parametrize("own, files, expected", [
    ("0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": "150000 100000",
                             "kubepods/cpu.max": "max 100000"}, 1.5),
    ("0::/\n", {"cpu.max": "max 100000"}, None),
    ("3:cpu,cpuacct:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "200000",
                                      "cpu/cpu.cfs_period_us": "100000"}, 2.0),
    ("3:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
     None),
])
def test_a_containers_cpu_quota_is_read_from_its_cgroup(tmp_path, own, files, expected):
    assert machine.cgroup_cpus(*_layout(tmp_path, own, files)) == expected


@pytest.mark.parametrize("own, files, expected", [
    # a pod's room (4 GB, 3 GB used) is less than the node's available 10 GB
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/memory.max": "4294967296",
                                "kubepods/pod1/memory.current": "3221225472",
                                "kubepods/pod1/c1/memory.max": "max",
                                "kubepods/pod1/c1/memory.current": "3000000000"}, 1 << 30),
    # v1, over its limit (the kernel reclaims, then kills): no room
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": "1073741824",
                      "memory/memory.usage_in_bytes": "1100000000"}, 0),
    # no limit: the node's available memory
    ("0::/user.slice\n", {"user.slice/memory.max": "max",
                          "user.slice/memory.current": "123"}, 10 << 30),
])
def test_free_memory_is_the_nodes_available_or_the_containers_room(tmp_path, own, files,
                                                                    expected):
    cgroup, mount = _layout(tmp_path, own, files)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {64 << 20} kB\nMemFree:        {1 << 20} kB\n"
                       f"MemAvailable:   {10 << 20} kB\n")
    assert machine.free_bytes(meminfo, cgroup, mount) == expected
    assert machine.free_bytes(tmp_path / "none", tmp_path / "none", mount) is None


def test_what_a_process_may_use_is_its_containers_where_less(monkeypatch):
    """A request is refused against the limit the kernel kills at, and a session sized to
    the machine takes the CPUs its quota gives, not the node's."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(machine, "cgroup_limit", lambda: 64 << 20)
    assert machine.machine_bytes() == 64 << 20
    monkeypatch.setattr(machine, "cgroup_limit", lambda: physical * 2)
    assert machine.machine_bytes() == physical
    pinned = len(os.sched_getaffinity(0))
    monkeypatch.setattr(machine, "cgroup_cpus", lambda: 0.5)
    assert machine.usable_cpus() == 1
    monkeypatch.setattr(machine, "cgroup_cpus", lambda: pinned + 8.0)
    assert machine.usable_cpus() == pinned
